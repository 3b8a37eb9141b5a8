#include "core/container.h"

#include <charconv>

#include <fmt/format.h>

namespace gpufleet {
namespace {

bool IsCleanAbsolutePath(std::string_view path) {
  if (path.empty() || path.front() != '/' || path.size() > kMaxMountPathBytes) return false;
  for (char c : path)
    if (c == '\0' || c == ':' || c == ',' || c == '\n') return false;
  // "..": a target must not climb out of the container's root (runc resolves it safely, but a
  // user who writes it has made a mistake worth hearing about).
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    if (path.substr(start, end - start) == "..") return false;
    start = end + 1;
  }
  return true;
}

std::optional<uint32_t> ParseId(std::string_view text) {
  uint32_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

std::optional<std::string> ValidateContainerSpec(const ContainerSpec& spec) {
  if (spec.image.empty()) {
    if (!spec.mounts.empty() || !spec.user.empty())
      return "'mounts' and 'user' need an 'image': they describe a container";
    return std::nullopt;
  }
  if (spec.image.size() > kMaxImageReferenceBytes)
    return fmt::format("'image' is {} bytes; at most {}", spec.image.size(),
                       kMaxImageReferenceBytes);
  for (char c : spec.image)
    if (static_cast<unsigned char>(c) <= ' ' || c == '\x7f')
      return fmt::format("'image' '{}' has a space or control character", spec.image);
  if (spec.image.front() == '-') return fmt::format("'image' '{}' starts with '-'", spec.image);
  if (IsImageArchivePath(spec.image) && spec.image.find("/../") != std::string::npos)
    return fmt::format("'image' path '{}' must not contain '..'", spec.image);
  if (spec.mounts.size() > kMaxContainerMounts)
    return fmt::format("{} mounts; at most {}", spec.mounts.size(), kMaxContainerMounts);
  for (const ContainerMount& mount : spec.mounts) {
    if (!IsCleanAbsolutePath(mount.source))
      return fmt::format(
          "mount source '{}' must be an absolute path without ':', ',' or '..' segments",
          mount.source);
    if (!IsCleanAbsolutePath(mount.target) || mount.target == "/")
      return fmt::format(
          "mount target '{}' must be an absolute path other than '/', without ':', ',' or '..'",
          mount.target);
    for (const ContainerMount& other : spec.mounts)
      if (&other != &mount && other.target == mount.target)
        return fmt::format("two mounts have the target '{}'", mount.target);
  }
  std::string error;
  if (!spec.user.empty() && !ParseContainerUser(spec.user, error)) return error;
  return std::nullopt;
}

std::optional<ContainerMount> ParseContainerMount(std::string_view text, std::string& error) {
  ContainerMount mount;
  size_t first = text.find(':');
  if (first == std::string_view::npos) {
    error = fmt::format("mount '{}' is not SOURCE:TARGET[:ro|rw]", text);
    return std::nullopt;
  }
  mount.source = std::string(text.substr(0, first));
  std::string_view rest = text.substr(first + 1);
  size_t second = rest.find(':');
  mount.target = std::string(rest.substr(0, second));
  if (second != std::string_view::npos) {
    std::string_view mode = rest.substr(second + 1);
    if (mode == "ro") {
      mount.read_only = true;
    } else if (mode == "rw") {
      mount.read_only = false;
    } else {
      error = fmt::format("mount '{}': the mode must be 'ro' or 'rw', not '{}'", text, mode);
      return std::nullopt;
    }
  }
  ContainerSpec check{"x", {mount}, ""};
  if (auto why = ValidateContainerSpec(check)) {
    error = *why;
    return std::nullopt;
  }
  return mount;
}

std::string FormatContainerMount(const ContainerMount& mount) {
  return fmt::format("{}:{}:{}", mount.source, mount.target, mount.read_only ? "ro" : "rw");
}

std::optional<ContainerUser> ParseContainerUser(std::string_view text, std::string& error) {
  ContainerUser user;
  size_t colon = text.find(':');
  auto uid = ParseId(text.substr(0, colon));
  std::optional<uint32_t> gid;
  if (colon != std::string_view::npos) gid = ParseId(text.substr(colon + 1));
  if (!uid || (colon != std::string_view::npos && !gid)) {
    error =
        fmt::format("'user' must be UID or UID:GID (numbers, as inside the image), not '{}'", text);
    return std::nullopt;
  }
  user.uid = *uid;
  user.gid = gid;
  return user;
}

}  // namespace gpufleet
