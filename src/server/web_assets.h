#pragma once

// The dashboard's static files (web/), built into the binary so that a server needs nothing
// beside it and nothing is fetched from elsewhere at run time (docs/dashboard.md).

#include <string_view>

namespace gpufleet::server {

struct WebAsset {
  std::string_view path;  // "/app.js": the file's path under web/
  std::string_view content_type;
  std::string_view body;
};

// nullptr when web/ has no such file.
const WebAsset* FindWebAsset(std::string_view path);

}  // namespace gpufleet::server
