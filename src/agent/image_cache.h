#pragma once

// The node's image cache (docs/containers.md): each image a job names is unpacked once into a
// root filesystem under the cache directory and shared, read-only, by every container started
// from it (each gets its own writable overlay on top). Entries are keyed by what the image is:
// a local archive by its path, size and modification time, a reference by the image ID podman
// resolves it to. A shim holds a shared lock on the entry its container uses; garbage collection
// removes the least recently used entries nobody holds once the cache outgrows its size.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/types.h"

namespace gpufleet::agent {

struct ImageCacheConfig {
  std::string dir;                                       // created if missing
  int64_t max_bytes = int64_t{20} * 1024 * 1024 * 1024;  // unpacked size the cache keeps
  std::string podman = "podman";  // prepares references and `podman save` archives
  TimeMs prepare_timeout_ms = 30 * 60 * kMsPerSecond;
};

struct PreparedImage {
  std::string key;
  std::string rootfs;  // the unpacked root filesystem
  int64_t size_bytes = 0;
  bool was_cached = false;  // found ready rather than prepared now
  int lock_fd = -1;         // shared lock on the entry; closing it releases the entry
};

struct CachedImage {
  std::string key;
  std::string image;  // as first named
  int64_t size_bytes = 0;
  TimeMs last_used_ms = 0;
  bool in_use = false;
};

using ImageLog = std::function<void(const std::string&)>;

// Unpacks `image` unless the cache has it, then holds it (PreparedImage::lock_fd). Returns why
// not: a missing archive, a reference podman cannot pull, a file that is no image.
std::optional<std::string> PrepareImage(const ImageCacheConfig& config, const std::string& image,
                                        PreparedImage& prepared, const ImageLog& log);

std::vector<CachedImage> ListCachedImages(const ImageCacheConfig& config);

// Removes unused entries, least recently used first, until the cache holds at most max_bytes;
// never `keep_key`. Returns the keys removed.
std::vector<std::string> CollectImageGarbage(const ImageCacheConfig& config,
                                             const std::string& keep_key, const ImageLog& log);

}  // namespace gpufleet::agent
