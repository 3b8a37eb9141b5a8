-- wrk script: every request submits one job (durable before the 201). The token comes from the
-- GPUFLEET_TOKEN environment variable; bench/api_measure.py sets it.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("GPUFLEET_TOKEN")
wrk.body = '{"command": ["python3", "train.py"], "gpus": 1, "name": "bench"}'

local statuses = {}
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  io.write(string.format("latency_p50_ms %.3f\nlatency_p99_ms %.3f\n",
                         latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
