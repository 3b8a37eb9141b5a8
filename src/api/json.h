#pragma once

// JSON for the API's wire types (api/types.h). Users' input goes through the strict parsers,
// which name the field that is wrong and refuse unknown fields; what gpufleet's own processes
// send each other and what the server stores read leniently (a missing field keeps its default)
// so that a newer peer can add fields. See docs/api.md for the shapes.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "api/types.h"

namespace gpufleet::api {

// No request of the API nests deeper than a few levels: a deeper body is refused while parsing.
inline constexpr int kMaxRequestJsonDepth = 32;
// A request body as JSON; nothing and "malformed JSON: ..." or "... nests deeper ..." otherwise.
std::optional<nlohmann::json> ParseRequestJson(std::string_view text, std::string& error);

// A user's job: unknown fields, wrong types and impossible values give a precise error.
std::optional<JobSubmission> ParseJobSubmission(const nlohmann::json& body, std::string& error);
// The same from text (JSON; the CLI converts YAML job files to JSON first).
std::optional<JobSubmission> ParseJobSubmissionText(std::string_view text, std::string& error);

void to_json(nlohmann::json& out, const JobSubmission& value);
void from_json(const nlohmann::json& in, JobSubmission& value);  // strict; throws on errors
void to_json(nlohmann::json& out, const JobEvent& value);
void from_json(const nlohmann::json& in, JobEvent& value);
void to_json(nlohmann::json& out, const TaskStatus& value);
void from_json(const nlohmann::json& in, TaskStatus& value);
void to_json(nlohmann::json& out, const ReplicaOf& value);
void from_json(const nlohmann::json& in, ReplicaOf& value);
void to_json(nlohmann::json& out, const JobRecord& value);
void from_json(const nlohmann::json& in, JobRecord& value);
void to_json(nlohmann::json& out, const GpuStatus& value);
void from_json(const nlohmann::json& in, GpuStatus& value);
void to_json(nlohmann::json& out, const NodeReport& value);
void from_json(const nlohmann::json& in, NodeReport& value);
void to_json(nlohmann::json& out, const NodeRecord& value);
void from_json(const nlohmann::json& in, NodeRecord& value);
void to_json(nlohmann::json& out, const QueueStatus& value);
void from_json(const nlohmann::json& in, QueueStatus& value);
void to_json(nlohmann::json& out, const TokenInfo& value);
void from_json(const nlohmann::json& in, TokenInfo& value);
void to_json(nlohmann::json& out, const AuditEntry& value);
void from_json(const nlohmann::json& in, AuditEntry& value);
void to_json(nlohmann::json& out, const WorkloadReport& value);
void from_json(const nlohmann::json& in, WorkloadReport& value);
void to_json(nlohmann::json& out, const SyncRequest& value);
void from_json(const nlohmann::json& in, SyncRequest& value);
void to_json(nlohmann::json& out, const TaskLaunch& value);
void from_json(const nlohmann::json& in, TaskLaunch& value);
void to_json(nlohmann::json& out, const SyncResponse& value);
void from_json(const nlohmann::json& in, SyncResponse& value);

// A user's deployment, as strict as a job: the field that is wrong, unknown fields refused.
std::optional<DeploymentSpec> ParseDeploymentSpec(const nlohmann::json& body, std::string& error);
std::optional<DeploymentSpec> ParseDeploymentSpecText(std::string_view text, std::string& error);
// A DNS label (RFC 1123): what a deployment's name must be, as it routes by Host.
bool ValidDeploymentName(std::string_view name);

void to_json(nlohmann::json& out, const AutoscalingSpec& value);
void to_json(nlohmann::json& out, const DeploymentSpec& value);
void from_json(const nlohmann::json& in, DeploymentSpec& value);  // strict; throws on errors
void to_json(nlohmann::json& out, const ReplicaStatus& value);
void from_json(const nlohmann::json& in, ReplicaStatus& value);
void to_json(nlohmann::json& out, const DeploymentRecord& value);
void from_json(const nlohmann::json& in, DeploymentRecord& value);
void to_json(nlohmann::json& out, const EndpointInfo& value);
void from_json(const nlohmann::json& in, EndpointInfo& value);
void to_json(nlohmann::json& out, const DeploymentEndpoints& value);
void from_json(const nlohmann::json& in, DeploymentEndpoints& value);
void to_json(nlohmann::json& out, const EndpointSet& value);
void from_json(const nlohmann::json& in, EndpointSet& value);
void to_json(nlohmann::json& out, const DeploymentLoadReport& value);
void from_json(const nlohmann::json& in, DeploymentLoadReport& value);
void to_json(nlohmann::json& out, const GatewayReport& value);
void from_json(const nlohmann::json& in, GatewayReport& value);

// "0.5" for 500 milli-GPUs, "8" for 8000: how GPUs are shown to people.
std::string FormatGpus(MilliGpu milli);

}  // namespace gpufleet::api
