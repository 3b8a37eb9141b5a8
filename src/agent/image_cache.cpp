#include "agent/image_cache.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/command_runner.h"
#include "agent/executor_util.h"

namespace gpufleet::agent {
namespace {

namespace fs = std::filesystem;
using executor_internal::ErrnoText;
using executor_internal::WallClockMs;
using json = nlohmann::json;

constexpr TimeMs kQuickCommandMs = 60 * kMsPerSecond;

// FNV-1a: a stable name for a cache entry (std::hash may differ between builds).
std::string StableHash(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return fmt::format("{:016x}", hash);
}

std::string EntryDir(const ImageCacheConfig& config, const std::string& key) {
  return config.dir + "/" + key;
}
std::string LockPath(const ImageCacheConfig& config, const std::string& key) {
  return config.dir + "/locks/" + key + ".lock";
}

int OpenLock(const ImageCacheConfig& config, const std::string& key) {
  return ::open(LockPath(config, key).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
}

// What kind of archive a local file is, from the names of its first entries: a `podman save`
// (docker-archive) has manifest.json, an OCI layout has oci-layout; anything else is taken as a
// root filesystem. Only uncompressed tar is looked into; a compressed file is a root filesystem.
std::string ArchiveTransport(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  char header[512];
  for (int entry = 0; entry < 256 && file.read(header, sizeof header); ++entry) {
    if (header[0] == '\0') break;
    if (std::memcmp(header + 257, "ustar", 5) != 0) break;  // not a (POSIX) tar header
    std::string name(header, strnlen(header, 100));
    if (name.rfind("./", 0) == 0) name.erase(0, 2);
    if (name == "manifest.json") return "docker-archive";
    if (name == "oci-layout") return "oci-archive";
    uint64_t size = 0;
    for (int i = 124; i < 136 && header[i] >= '0' && header[i] <= '7'; ++i)
      size = size * 8 + static_cast<uint64_t>(header[i] - '0');
    file.seekg(static_cast<std::streamoff>((size + 511) / 512 * 512), std::ios::cur);
  }
  return "";
}

int64_t TreeBytes(const std::string& dir) {
  int64_t total = 0;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(
           dir, fs::directory_options::skip_permission_denied, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    struct stat info {};
    if (::lstat(it->path().c_str(), &info) == 0 && S_ISREG(info.st_mode))
      total += static_cast<int64_t>(info.st_blocks) * 512;
  }
  return total;
}

void TouchLastUsed(const std::string& entry_dir) {
  const std::string marker = entry_dir + "/last-used";
  int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::futimens(fd, nullptr);
    ::close(fd);
  }
}

TimeMs LastUsedMs(const std::string& entry_dir) {
  struct stat info {};
  if (::stat((entry_dir + "/last-used").c_str(), &info) != 0) return 0;
  return static_cast<TimeMs>(info.st_mtim.tv_sec) * 1000 + info.st_mtim.tv_nsec / 1'000'000;
}

// Where the image comes from and the key of what it is now.
struct Source {
  std::string podman_ref;  // empty: a root filesystem archive at `archive`
  std::string archive;
  std::string key;
};

std::optional<std::string> Resolve(const ImageCacheConfig& config, const std::string& image,
                                   Source& source, const ImageLog& log) {
  std::string archive;
  std::string transport;
  for (const char* prefix : {"docker-archive:", "oci-archive:"}) {
    if (image.rfind(prefix, 0) == 0) {
      transport = std::string(prefix, std::strlen(prefix) - 1);
      archive = image.substr(std::strlen(prefix));
    }
  }
  if (image.front() == '/') archive = image;
  if (!archive.empty()) {
    struct stat info {};
    if (::stat(archive.c_str(), &info) != 0)
      return fmt::format("image archive '{}': {}", archive, ErrnoText(errno));
    if (!S_ISREG(info.st_mode)) return fmt::format("image archive '{}' is not a file", archive);
    if (transport.empty()) transport = ArchiveTransport(archive);
    source.archive = archive;
    if (!transport.empty()) source.podman_ref = transport + ":" + archive;
    source.key = "a-" + StableHash(fmt::format("{}\n{}\n{}.{}", archive, info.st_size,
                                               info.st_mtim.tv_sec, info.st_mtim.tv_nsec));
    return std::nullopt;
  }
  // A reference: podman's store has it, or pulls it (from whatever registries the node reaches).
  source.podman_ref = image;
  CommandResult exists = RunCommand({config.podman, "image", "exists", image}, kQuickCommandMs);
  if (!exists.started)
    return fmt::format(
        "image '{}' is a reference, which needs podman on the node ({}); or name a local image "
        "archive by its absolute path",
        image, exists.output);
  if (exists.exit_code != 0) {
    log(fmt::format("pulling image {}", image));
    CommandResult pull =
        RunCommand({config.podman, "pull", "--quiet", image}, config.prepare_timeout_ms);
    if (!pull.ok()) return fmt::format("pull image '{}': {}", image, pull.Describe());
  }
  CommandResult inspect = RunCommand(
      {config.podman, "image", "inspect", "--format", "{{.Id}}", image}, kQuickCommandMs);
  std::string id = inspect.output;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' '))
    id.pop_back();
  if (!inspect.ok() || id.empty() || id.find_first_not_of("0123456789abcdef") != std::string::npos)
    return fmt::format("inspect image '{}': {}", image, inspect.Describe());
  source.key = "i-" + id.substr(0, 24);
  return std::nullopt;
}

std::optional<std::string> Unpack(const ImageCacheConfig& config, const Source& source,
                                  const std::string& target) {
  if (source.podman_ref.empty()) {
    // GNU tar recognises gzip, xz and zstd itself. Numeric owners: the image's uids, not ours.
    CommandResult tar = RunCommand({"tar", "--extract", "--numeric-owner", "--same-permissions",
                                    "--file", source.archive, "--directory", target},
                                   config.prepare_timeout_ms);
    if (!tar.ok())
      return fmt::format("unpack image archive '{}': {}", source.archive, tar.Describe());
    return std::nullopt;
  }
  // podman flattens the layers (whiteouts included) into one tree: create a container, export
  // its filesystem, remove it.
  const std::string name = fmt::format("gpufleet-prepare-{}-{}", source.key, ::getpid());
  CommandResult create = RunCommand(
      {config.podman, "create", "--name", name, source.podman_ref, "/bin/true"}, kQuickCommandMs);
  if (!create.ok()) return fmt::format("open image '{}': {}", source.podman_ref, create.Describe());
  CommandResult exported = RunCommand(
      {"bash", "-o", "pipefail", "-c",
       "\"$0\" export \"$1\" | tar --extract --numeric-owner --same-permissions --directory \"$2\"",
       config.podman, name, target},
      config.prepare_timeout_ms);
  RunCommand({config.podman, "rm", "--force", name}, kQuickCommandMs);
  if (!exported.ok())
    return fmt::format("export image '{}': {}", source.podman_ref, exported.Describe());
  return std::nullopt;
}

}  // namespace

std::optional<std::string> PrepareImage(const ImageCacheConfig& config, const std::string& image,
                                        PreparedImage& prepared, const ImageLog& log) {
  if (image.empty()) return "no image named";
  std::error_code error;
  fs::create_directories(config.dir + "/locks", error);
  if (error) return fmt::format("create the image cache '{}': {}", config.dir, error.message());
  Source source;
  if (auto why = Resolve(config, image, source, log)) return why;

  const std::string entry = EntryDir(config, source.key);
  const std::string rootfs = entry + "/rootfs";
  // Two locks per entry: `prepare` (exclusive) while one shim checks or unpacks it, so two tasks
  // naming one image unpack it once; `lock` (shared) while containers use it, which garbage
  // collection must take exclusively (never waiting) to remove the entry.
  const std::string prepare_path = config.dir + "/locks/" + source.key + ".prepare";
  int prepare_fd = ::open(prepare_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  int lock_fd = OpenLock(config, source.key);
  if (prepare_fd < 0 || lock_fd < 0 || ::flock(prepare_fd, LOCK_EX) != 0) {
    int err = errno;
    for (int fd : {prepare_fd, lock_fd})
      if (fd >= 0) ::close(fd);
    return fmt::format("lock image cache entry {}: {}", source.key, ErrnoText(err));
  }
  auto fail = [&](std::string why) {
    ::close(lock_fd);
    ::close(prepare_fd);
    return std::optional<std::string>(std::move(why));
  };
  struct stat info {};
  prepared.was_cached = ::stat((entry + "/image.json").c_str(), &info) == 0;
  if (!prepared.was_cached) {
    log(fmt::format("preparing image {}", image));
    const TimeMs started = WallClockMs();
    fs::remove_all(entry, error);
    const std::string staging = entry + ".unpacking";
    fs::remove_all(staging, error);
    if (::mkdir(staging.c_str(), 0755) != 0)
      return fail(fmt::format("create '{}': {}", staging, ErrnoText(errno)));
    if (auto why = Unpack(config, source, staging)) {
      fs::remove_all(staging, error);
      return fail(*why);
    }
    struct stat shell {};
    if (::lstat((staging + "/bin").c_str(), &shell) != 0 &&
        ::lstat((staging + "/usr").c_str(), &shell) != 0) {
      fs::remove_all(staging, error);
      return fail(
          fmt::format("image '{}' has neither /bin nor /usr: not a root filesystem", image));
    }
    if (::mkdir(entry.c_str(), 0755) != 0 || ::rename(staging.c_str(), rootfs.c_str()) != 0) {
      int err = errno;
      fs::remove_all(staging, error);
      return fail(fmt::format("move the unpacked image into '{}': {}", entry, ErrnoText(err)));
    }
    const int64_t size = TreeBytes(rootfs);
    json meta = {{"image", image},
                 {"key", source.key},
                 {"size_bytes", size},
                 {"prepared_at_ms", WallClockMs()},
                 {"prepare_ms", WallClockMs() - started}};
    if (auto why = executor_internal::WriteFileAtomically(entry + "/image.json", meta.dump()))
      return fail("record the prepared image: " + *why);
    log(fmt::format("prepared image {} in {} ms ({} MiB unpacked)", image, WallClockMs() - started,
                    size / (1024 * 1024)));
  }
  if (auto text = executor_internal::ReadFileToString(entry + "/image.json")) {
    try {
      prepared.size_bytes = json::parse(*text).value("size_bytes", int64_t{0});
    } catch (const json::exception&) {
    }
  }
  TouchLastUsed(entry);
  // In use from here on: other tasks may use it too, garbage collection may not remove it.
  if (::flock(lock_fd, LOCK_SH) != 0)
    return fail(fmt::format("lock image cache entry {}: {}", source.key, ErrnoText(errno)));
  ::close(prepare_fd);
  prepared.key = source.key;
  prepared.rootfs = rootfs;
  prepared.lock_fd = lock_fd;
  return std::nullopt;
}

std::vector<CachedImage> ListCachedImages(const ImageCacheConfig& config) {
  std::vector<CachedImage> images;
  std::error_code error;
  for (const auto& item : fs::directory_iterator(config.dir, error)) {
    const std::string meta_path = item.path().string() + "/image.json";
    auto text = executor_internal::ReadFileToString(meta_path);
    if (!text) continue;
    CachedImage image;
    image.key = item.path().filename().string();
    try {
      json meta = json::parse(*text);
      image.image = meta.value("image", std::string());
      image.size_bytes = meta.value("size_bytes", int64_t{0});
    } catch (const json::exception&) {
      continue;
    }
    image.last_used_ms = LastUsedMs(item.path().string());
    int fd = ::open(LockPath(config, image.key).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      image.in_use = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
      ::close(fd);
    }
    images.push_back(std::move(image));
  }
  return images;
}

std::vector<std::string> CollectImageGarbage(const ImageCacheConfig& config,
                                             const std::string& keep_key, const ImageLog& log) {
  std::vector<std::string> removed;
  std::vector<CachedImage> images = ListCachedImages(config);
  int64_t total = 0;
  for (const CachedImage& image : images)
    total += image.size_bytes;
  std::sort(images.begin(), images.end(), [](const CachedImage& a, const CachedImage& b) {
    return a.last_used_ms < b.last_used_ms;
  });
  for (const CachedImage& image : images) {
    if (total <= config.max_bytes) break;
    if (image.key == keep_key) continue;
    int fd = OpenLock(config, image.key);
    if (fd < 0) continue;
    // Exclusive and not waiting: an entry some container holds, or a shim is about to, stays.
    const std::string prepare_path = config.dir + "/locks/" + image.key + ".prepare";
    int prepare_fd = ::open(prepare_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (prepare_fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        ::flock(prepare_fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code error;
      const std::string entry = EntryDir(config, image.key);
      const std::string doomed = entry + ".removing";
      if (::rename(entry.c_str(), doomed.c_str()) == 0) {
        fs::remove_all(doomed, error);
        total -= image.size_bytes;
        removed.push_back(image.key);
        log(fmt::format("image cache over {} MiB: removed {} ({} MiB, unused)",
                        config.max_bytes / (1024 * 1024), image.image,
                        image.size_bytes / (1024 * 1024)));
      }
    }
    if (prepare_fd >= 0) ::close(prepare_fd);
    ::close(fd);
  }
  return removed;
}

}  // namespace gpufleet::agent
