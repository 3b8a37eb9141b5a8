#pragma once

// Routes from a file, for the standalone gateway (`gpufleet gateway --routes FILE`): a YAML or
// JSON list of deployments with their endpoints. Kept apart from the proxy, which takes routes
// from whoever calls SetRoutes (this file, or the control plane).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/gateway.h"

namespace gpufleet::gateway {

// Parses
//   - deployment: llama          # or `routes:` holding this list
//     team: ml
//     llm: true                  # optional, default false
//     models: [llama-3-8b, sql-lora]
//     endpoints: ["127.0.0.1:8001", {id: j7, address: "127.0.0.1:8002", draining: true}]
// Nothing and `error` (with the place) when malformed.
std::optional<std::vector<Route>> ParseRoutes(std::string_view text, std::string& error);
std::optional<std::vector<Route>> LoadRoutesFile(const std::string& path, std::string& error);

}  // namespace gpufleet::gateway
