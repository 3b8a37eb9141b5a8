#pragma once

// What a job or deployment asks of a container (docs/containers.md): the image it runs from, the
// node directories it sees, and the user it runs as inside. Shared by the API, which refuses a bad
// spec at submission, and the agent, which checks it again before it starts anything.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpufleet {

// A node directory shown inside the container: datasets read-only, checkpoints read-write.
struct ContainerMount {
  std::string source;  // absolute path on the node
  std::string target;  // absolute path in the container
  bool read_only = true;
  bool operator==(const ContainerMount&) const = default;
};

struct ContainerSpec {
  // Empty: no container, the task runs as a plain process. Otherwise an image reference
  // ("localhost/train:1", "docker.io/library/python:3.11", "docker-archive:/img.tar") or the
  // absolute path of a local image archive (a root filesystem tarball or a `podman save` file).
  std::string image;
  std::vector<ContainerMount> mounts;
  // "UID" or "UID:GID" inside the container; empty: the image's root, unless the node runs
  // workloads as per-job users (then theirs).
  std::string user;
  bool operator==(const ContainerSpec&) const = default;
  bool empty() const { return image.empty() && mounts.empty() && user.empty(); }
};

inline constexpr size_t kMaxImageReferenceBytes = 1024;
inline constexpr size_t kMaxContainerMounts = 32;
inline constexpr size_t kMaxMountPathBytes = 4096;

// Why the spec cannot be run, or nothing.
std::optional<std::string> ValidateContainerSpec(const ContainerSpec& spec);

// "SOURCE:TARGET[:ro|rw]" (ro by default), as `--mount` and YAML lists write it.
std::optional<ContainerMount> ParseContainerMount(std::string_view text, std::string& error);
std::string FormatContainerMount(const ContainerMount& mount);

struct ContainerUser {
  uint32_t uid = 0;
  std::optional<uint32_t> gid;  // unset: the same number as the uid
};
std::optional<ContainerUser> ParseContainerUser(std::string_view text, std::string& error);

// Whether the image names a local archive (an absolute path) rather than a reference.
inline bool IsImageArchivePath(std::string_view image) {
  return !image.empty() && image.front() == '/';
}

}  // namespace gpufleet
