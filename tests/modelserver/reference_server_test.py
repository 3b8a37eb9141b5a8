"""The reference model server (examples/model-server/gpufleet_reference_server.py) through its
HTTP API on loopback: deterministic completions, SSE streaming, vLLM metrics under load, the
prefix cache, LoRA slots, errors, the load delay, the SIGTERM drain and client disconnects.
The server runs under Debian's python3 (python3-torch); this driver needs the stdlib only.

Usage: reference_server_test.py [test-name ...]"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

TORCH_PYTHON = "/usr/bin/python3"  # Debian's interpreter, where python3-torch is installed
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                      "model-server", "gpufleet_reference_server.py")


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class ReferenceServer:
    """Starts the server on an ephemeral loopback port; stops it (SIGKILL) on exit."""

    def __init__(self, *args, wait_ready=True):
        self.args = list(args)
        self.wait_ready = wait_ready
        self.log = []

    def __enter__(self):
        self.process = subprocess.Popen(
            [TORCH_PYTHON, SERVER, "--port", "0", *self.args], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        listening = threading.Event()

        def read_log():
            for line in self.process.stderr:
                self.log.append(line)
                match = re.search(r"listening on ([\d.]+):(\d+)", line)
                if match:
                    self.port = int(match.group(2))
                    listening.set()

        threading.Thread(target=read_log, daemon=True).start()
        if not listening.wait(20):
            self.process.kill()
            raise AssertionError(f"the server did not listen: {''.join(self.log)}")
        if self.wait_ready:
            wait_until(lambda: self.get("/health")[0] == 200, 30, "the server to be ready")
        return self

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def connection(self, timeout=30):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(self, path):
        connection = self.connection()
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode()
        except OSError:
            return None, ""
        finally:
            connection.close()

    def post(self, path, body, connection=None):
        own = connection is None
        connection = connection or self.connection()
        try:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            connection.request("POST", path, data, {"Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read().decode()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text
        finally:
            if own:
                connection.close()

    def complete(self, **body):
        status, answer = self.post("/v1/completions", body)
        check(status == 200, f"completion answered {status}: {answer}")
        return answer

    def metrics(self):
        status, text = self.get("/metrics")
        check(status == 200, f"/metrics answered {status}")
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name_labels, value = line.rsplit(" ", 1)
                values[name_labels] = float(value)
        return values, text

    def metric(self, name, extra=""):
        values, _ = self.metrics()
        key = f'{name}{{model_name="reference",engine="0"{extra}}}'
        check(key in values, f"{key} missing from /metrics")
        return values[key]


class Stream:
    """A streaming completion read event by event."""

    def __init__(self, server, path, body):
        self.connection = server.connection()
        self.connection.request("POST", path, json.dumps({**body, "stream": True}),
                                {"Content-Type": "application/json"})
        self.response = self.connection.getresponse()
        check(self.response.status == 200, f"stream answered {self.response.status}")
        check(self.response.getheader("Content-Type") == "text/event-stream",
              f"stream content type {self.response.getheader('Content-Type')}")

    def next_event(self):
        """The next `data:` payload (parsed JSON, or the string [DONE]); None at the end."""
        while True:
            line = self.response.readline()
            if not line:
                return None
            line = line.decode().rstrip("\n")
            if not line:
                continue
            check(line.startswith("data: "), f"not an SSE data line: {line!r}")
            payload = line[len("data: "):]
            blank = self.response.readline()
            check(blank == b"\n", f"an event not ended by a blank line: {blank!r}")
            return payload if payload == "[DONE]" else json.loads(payload)

    def rest(self):
        events = []
        while True:
            event = self.next_event()
            if event is None:
                return events
            events.append(event)

    def close(self):
        self.connection.sock.shutdown(socket.SHUT_RDWR)
        self.connection.close()


def stream_text(events):
    return "".join(e["choices"][0].get("text", "") for e in events
                   if isinstance(e, dict) and e["choices"])


def test_completions_are_deterministic():
    with ReferenceServer() as server:
        greedy = dict(prompt="The quick brown fox", max_tokens=32, temperature=0)
        first, second = server.complete(**greedy), server.complete(**greedy)
        text = first["choices"][0]["text"]
        check(text == second["choices"][0]["text"], f"greedy differs: {first} vs {second}")
        check(len(text) == 32 and first["choices"][0]["finish_reason"] == "length",
              f"greedy answer: {first}")
        check(len(set(text)) > 3, f"the greedy text is degenerate: {text!r}")
        usage = first["usage"]
        # The prompt is a BOS token plus its UTF-8 bytes.
        check(usage["prompt_tokens"] == 20 and usage["completion_tokens"] == 32
              and usage["total_tokens"] == 52, f"usage: {usage}")
        check(first["object"] == "text_completion" and first["model"] == "reference"
              and first["id"].startswith("cmpl-"), f"envelope: {first}")

        sampled = dict(prompt="The quick brown fox", max_tokens=32, temperature=0.9, seed=7)
        a, b = server.complete(**sampled), server.complete(**sampled)
        other = server.complete(**{**sampled, "seed": 8})
        check(a["choices"][0]["text"] == b["choices"][0]["text"], "same seed, different text")
        check(a["choices"][0]["text"] != other["choices"][0]["text"],
              "another seed gave the same text")
        check(a["choices"][0]["text"] != text, "sampling at temperature 0.9 gave the greedy text")

        # A stop string ends the text before it, with the reason.
        stop = text[10:12]
        stopped = server.complete(**greedy, stop=[stop])["choices"][0]
        check(stopped["text"] == text[:text.find(stop)] and stopped["finish_reason"] == "stop"
              and stopped["stop_reason"] == stop, f"stop {stop!r} in {text!r}: {stopped}")

        # A list of prompts: one choice each, in order.
        several = server.complete(prompt=["The quick brown fox", "hello"], max_tokens=8,
                                  temperature=0)
        check([c["index"] for c in several["choices"]] == [0, 1]
              and several["choices"][0]["text"] == text[:8]
              and several["usage"]["completion_tokens"] == 16, f"two prompts: {several}")

        status, chat = server.post("/v1/chat/completions", {
            "model": "reference", "messages": [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hi"}],
            "max_tokens": 12, "temperature": 0})
        check(status == 200 and chat["object"] == "chat.completion"
              and chat["choices"][0]["message"]["role"] == "assistant"
              and len(chat["choices"][0]["message"]["content"]) == 12, f"chat: {chat}")


def test_stream_arrives_token_by_token():
    with ReferenceServer() as server:
        body = dict(prompt="Streaming test", max_tokens=400, temperature=0)
        stream = Stream(server, "/v1/completions",
                        {**body, "stream_options": {"include_usage": True}})
        first = stream.next_event()
        check(first["object"] == "text_completion" and len(first["choices"][0]["text"]) == 1
              and first["choices"][0]["finish_reason"] is None, f"first chunk: {first}")
        # The first chunk came while the sequence was still being decoded.
        check(server.metric("vllm:num_requests_running") == 1,
              "the stream's first chunk came only after generation ended")
        events = [first] + stream.rest()
        check(events[-1] == "[DONE]", f"the stream ends with {events[-1]!r}")
        usage_chunk = events[-2]
        check(usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 400,
              f"usage chunk: {usage_chunk}")
        final = events[-3]["choices"][0]
        check(final["finish_reason"] == "length" and final["text"] == "", f"final: {final}")
        text_chunks = [e for e in events[:-3] if e["choices"][0]["text"]]
        check(len(text_chunks) == 400, f"{len(text_chunks)} text chunks for 400 tokens")
        whole = server.complete(**body)["choices"][0]["text"]
        check(stream_text(events) == whole, "the streamed text differs from the whole answer")

        # Text that may begin a stop string is held back, so the stop string never streams.
        stop = whole[20:23]
        stopped = Stream(server, "/v1/completions", {**body, "stop": stop}).rest()
        check(stream_text(stopped) == whole[:whole.find(stop)]
              and stopped[-2]["choices"][0]["finish_reason"] == "stop",
              f"stream with stop {stop!r}: {stream_text(stopped)!r} of {whole!r}")

        chat = Stream(server, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5})
        events = chat.rest()
        check(events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
              and all(e["object"] == "chat.completion.chunk" for e in events[:-1])
              and sum(len(e["choices"][0]["delta"].get("content", "")) for e in events[:-1]) == 5
              and events[-2]["choices"][0]["finish_reason"] == "length"
              and events[-1] == "[DONE]", f"chat stream: {events}")


def test_metrics_move_under_load():
    with ReferenceServer("--max-num-seqs", "2") as server:
        _, text = server.metrics()
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                     "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total",
                     "vllm:gpu_prefix_cache_hits_total", "vllm:prompt_tokens_total",
                     "vllm:generation_tokens_total",
                     "vllm:time_to_first_token_seconds_bucket",
                     "vllm:e2e_request_latency_seconds_bucket"):
            check(f'{name}{{model_name="reference",engine="0"' in text, f"{name} missing")
        check("# TYPE vllm:time_to_first_token_seconds histogram" in text, "TTFT type")
        check("vllm:lora_requests_info" not in text, "LoRA info without adapters")

        results = []

        def one(number):
            results.append(server.complete(prompt=f"request {number}", max_tokens=150,
                                           temperature=0))

        threads = [threading.Thread(target=one, args=(n,)) for n in range(5)]
        for thread in threads:
            thread.start()
        wait_until(lambda: server.metric("vllm:num_requests_running") == 2
                   and server.metric("vllm:num_requests_waiting") == 3, 20,
                   "2 running and 3 waiting")
        check(server.metric("vllm:kv_cache_usage_perc") > 0, "no KV usage while running")
        for thread in threads:
            thread.join(60)
        check(len(results) == 5, f"{len(results)} of 5 requests answered")
        check(server.metric("vllm:num_requests_running") == 0
              and server.metric("vllm:num_requests_waiting") == 0, "requests left over")
        check(server.metric("vllm:kv_cache_usage_perc") == 0, "KV blocks still in use")
        check(server.metric("vllm:generation_tokens_total") == 750, "generation tokens")
        prompt_tokens = sum(r["usage"]["prompt_tokens"] for r in results)
        check(server.metric("vllm:prompt_tokens_total") == prompt_tokens, "prompt tokens")
        check(server.metric("vllm:time_to_first_token_seconds_count") == 5, "TTFT count")
        check(server.metric("vllm:e2e_request_latency_seconds_count") == 5, "e2e count")
        check(server.metric("vllm:e2e_request_latency_seconds_bucket", ',le="+Inf"') == 5,
              "e2e +Inf bucket")
        check(server.metric("vllm:request_success_total", ',finished_reason="length"') == 5,
              "request_success_total")


def test_prefix_cache_hit_skips_prefill():
    # 80 blocks of 16 tokens: two 1000-token prompts do not both fit, so the second evicts.
    with ReferenceServer("--num-kv-blocks", "80", "--block-size", "16") as server:
        long_prompt = "".join(f"line {n}: the prefix cache keys full blocks. " for n in range(24))
        prompt_tokens = len(long_prompt.encode()) + 1
        check(900 < prompt_tokens < 1200, f"prompt of {prompt_tokens} tokens")
        cacheable = (prompt_tokens - 1) // 16 * 16

        def run(prompt):
            queries = server.metric("vllm:prefix_cache_queries_total")
            hits = server.metric("vllm:prefix_cache_hits_total")
            answer = server.complete(prompt=prompt, max_tokens=4, temperature=0)
            queried = server.metric("vllm:prefix_cache_queries_total") - queries
            hit = server.metric("vllm:prefix_cache_hits_total") - hits
            check(answer["usage"]["prompt_tokens_details"]["cached_tokens"] == hit,
                  f"usage says {answer['usage']} but the hits counter moved {hit}")
            check(queried == answer["usage"]["prompt_tokens"], "queries counter")
            return hit

        check(run(long_prompt) == 0, "a hit on a cold cache")
        # The repeat prefills only the tokens past the cached full blocks.
        check(run(long_prompt) == cacheable, "the repeat did not hit every full block")
        check(run(long_prompt + " and a new ending") == cacheable,
              "a longer prompt with the same start did not hit")
        check(run("x" + long_prompt) == 0, "a different first block hit the cache")
        # That prompt took most blocks: the first prompt's tail was evicted first, its head
        # (what later prompts share) survived.
        partial = run(long_prompt)
        check(0 < partial < cacheable, f"after eviction {partial} of {cacheable} tokens hit")
        check(server.metric("vllm:kv_cache_usage_perc") == 0, "cached blocks counted as used")

        # Out of KV blocks, a request waits though batch slots are free: this one holds 75 of
        # the 80 blocks ((prompt + 150 - 1) / 16), the next needs 10.
        holder = Stream(server, "/v1/completions",
                        dict(prompt="y" + long_prompt, max_tokens=150, temperature=0))
        holder.next_event()
        needed = -(-(prompt_tokens + 1 + 150 - 1) // 16)
        check(server.metric("vllm:kv_cache_usage_perc") == needed / 80, "KV usage of the holder")
        waiter = threading.Thread(target=server.complete, kwargs=dict(prompt="z" * 40,
                                                                      max_tokens=120))
        waiter.start()
        wait_until(lambda: server.metric("vllm:num_requests_waiting") == 1, 10,
                   "a request waiting for KV blocks")
        check(server.metric("vllm:num_requests_running") == 1, "the waiter runs without blocks")
        holder.rest()
        waiter.join(30)
        check(not waiter.is_alive() and server.metric("vllm:num_requests_waiting") == 0,
              "the waiter did not run once the blocks were freed")


def test_lora_adapters():
    with ReferenceServer("--lora-modules", "alpha", "beta=/models/beta", "--max-loras", "1",
                         "--lora-load-delay", "0.2") as server:
        status, models = server.get("/v1/models")
        ids = [m["id"] for m in json.loads(models)["data"]]
        check(status == 200 and ids == ["reference", "alpha", "beta"], f"models: {models}")
        info = re.compile(r'vllm:lora_requests_info\{max_lora="1",running_lora_adapters="([^"]*)",'
                          r'waiting_lora_adapters="([^"]*)"\}')
        check(info.findall(server.metrics()[1]) == [("", "")], "LoRA info before use")

        body = dict(prompt="The quick brown fox", max_tokens=24, temperature=0)
        base = server.complete(**body)["choices"][0]["text"]
        alpha = server.complete(**body, model="alpha")
        check(alpha["model"] == "alpha", f"answer model {alpha['model']}")
        alpha_text = alpha["choices"][0]["text"]
        check(alpha_text != base, "the adapter did not change the output")
        check(server.complete(**body, model="alpha")["choices"][0]["text"] == alpha_text,
              "the adapter is not deterministic")

        # One LoRA slot: while alpha runs, a beta request waits for it.
        stream = Stream(server, "/v1/completions",
                        {**body, "model": "alpha", "max_tokens": 300})
        stream.next_event()
        check(info.findall(server.metrics()[1]) == [("alpha", "")], "alpha not shown running")
        beta_answer = []
        beta = threading.Thread(target=lambda: beta_answer.append(
            server.complete(**body, model="beta")))
        beta.start()
        wait_until(lambda: info.findall(server.metrics()[1]) == [("alpha", "beta")], 10,
                   "beta waiting behind alpha")
        check(server.metric("vllm:num_requests_waiting") == 1, "beta not counted waiting")
        stream.rest()
        beta.join(30)
        check(beta_answer and beta_answer[0]["choices"][0]["text"] not in (base, alpha_text),
              f"beta answer: {beta_answer}")
        check(info.findall(server.metrics()[1]) == [("", "")], "LoRA info after use")


def test_bad_requests_get_clear_errors():
    with ReferenceServer("--max-body-bytes", "4096", "--max-model-len", "256") as server:
        def error(path, body, status, fragment):
            got, answer = server.post(path, body)
            check(got == status and isinstance(answer, dict) and fragment in
                  answer["error"]["message"] and answer["error"]["code"] == status,
                  f"{body!r:.80} -> {got} {answer}")
            return answer

        missing = error("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "nope")
        check(missing["error"]["type"] == "NotFoundError", f"type: {missing}")
        error("/v1/chat/completions", {"model": "gpt-4", "messages": []}, 404, "gpt-4")
        error("/v1/completions", b"{not json", 400, "not valid JSON")
        error("/v1/completions", b"[1, 2]", 400, "JSON object")
        error("/v1/completions", {"max_tokens": 3}, 400, "'prompt' is required")
        error("/v1/chat/completions", {"prompt": "x"}, 400, "'messages' is required")
        error("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "role")
        error("/v1/completions", {"prompt": 5}, 400, "'prompt' must be")
        error("/v1/completions", {"prompt": [1, 999]}, 400, "token ids")
        error("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens")
        error("/v1/completions", {"prompt": "x", "max_tokens": "9"}, 400, "max_tokens")
        error("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "temperature")
        error("/v1/completions", {"prompt": "x", "temperature": 7}, 400, "temperature")
        error("/v1/completions", {"prompt": "x", "n": 2}, 400, "'n'")
        error("/v1/completions", {"prompt": "x", "stop": [1]}, 400, "stop")
        error("/v1/completions", {"prompt": "y" * 300}, 400, "over the limit")
        error("/v1/completions", {"prompt": "y" * 200, "max_tokens": 100}, 400,
              "maximum context length is 256")
        error("/v1/completions", b'{"prompt": "' + b"z" * 5000 + b'"}', 413, "over the limit")
        error("/v1/embeddings", {"input": "x"}, 404, "no route")
        check(server.get("/nothing")[0] == 404, "GET of an unknown path")

        # Errors leave a keep-alive connection usable.
        connection = server.connection()
        for _ in range(2):
            status, _ = server.post("/v1/completions", b"{", connection)
            check(status == 400, f"bad JSON on keep-alive: {status}")
            status, answer = server.post("/v1/completions", {"prompt": "ok", "max_tokens": 2},
                                         connection)
            check(status == 200 and answer["usage"]["completion_tokens"] == 2, f"{answer}")
        connection.close()


def test_health_is_503_until_loaded():
    with ReferenceServer("--load-delay", "2", wait_ready=False) as server:
        started = time.monotonic()
        status, _ = server.get("/health")
        check(status == 503, f"/health answered {status} while loading")
        status, answer = server.post("/v1/completions", {"prompt": "x"})
        check(status == 503 and "loading" in answer["error"]["message"], f"{status} {answer}")
        wait_until(lambda: server.get("/health")[0] == 200, 30, "/health 200")
        check(time.monotonic() - started >= 1.5, "ready before the load delay passed")
        check(server.complete(prompt="x", max_tokens=2)["usage"]["completion_tokens"] == 2,
              "no completion once ready")


def test_sigterm_drains_in_flight_streams():
    with ReferenceServer() as server:
        stream = Stream(server, "/v1/completions",
                        dict(prompt="drain me", max_tokens=500, temperature=0))
        first = stream.next_event()
        server.process.send_signal(signal.SIGTERM)
        wait_until(lambda: server.get("/health")[0] == 503, 5, "/health 503 while draining")
        status, answer = server.post("/v1/completions", {"prompt": "too late"})
        check(status == 503 and "shutting down" in answer["error"]["message"],
              f"a new request while draining: {status} {answer}")
        events = [first] + stream.rest()
        check(events[-1] == "[DONE]" and len(stream_text(events)) == 500,
              f"the in-flight stream was cut: {len(stream_text(events))} characters")
        check(server.process.wait(20) == 0, "the drained server did not exit 0")

    with ReferenceServer() as server:
        stream = Stream(server, "/v1/completions", dict(prompt="x", max_tokens=1024))
        stream.next_event()
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(10)
        check(code == 1, f"a second SIGTERM exited {code}")
        received = []
        try:
            while True:
                event = stream.next_event()
                if event is None:
                    break
                received.append(event)
        except (http.client.HTTPException, OSError):
            pass  # cut mid-chunk: what this checks
        check("[DONE]" not in received and len(stream_text(received)) < 1024,
              "the stream finished though the server was told to exit at once")


def test_client_disconnect_frees_the_sequence():
    with ReferenceServer("--max-num-seqs", "1") as server:
        stream = Stream(server, "/v1/completions", dict(prompt="abandoned", max_tokens=1024))
        stream.next_event()
        check(server.metric("vllm:num_requests_running") == 1, "the stream is not running")
        check(server.metric("vllm:kv_cache_usage_perc") > 0, "the stream holds no KV blocks")
        stream.close()
        wait_until(lambda: server.metric("vllm:num_requests_running") == 0, 10,
                   "the abandoned stream to stop")
        check(server.metric("vllm:kv_cache_usage_perc") == 0, "its KV blocks were not freed")
        check(server.metric("vllm:generation_tokens_total") < 1024,
              "the abandoned stream ran to its end")

        # A whole (non-streamed) request whose client hangs up is aborted too.
        generated = server.metric("vllm:generation_tokens_total")
        connection = server.connection()
        connection.request("POST", "/v1/completions",
                           json.dumps({"prompt": "gone", "max_tokens": 1024}),
                           {"Content-Type": "application/json"})
        wait_until(lambda: server.metric("vllm:num_requests_running") == 1, 10, "it to run")
        connection.sock.shutdown(socket.SHUT_RDWR)
        connection.close()
        wait_until(lambda: server.metric("vllm:num_requests_running") == 0, 10,
                   "the abandoned request to stop")
        check(server.metric("vllm:generation_tokens_total") - generated < 1024,
              "the abandoned request ran to its end")
        # The only sequence slot is free again.
        check(server.complete(prompt="next", max_tokens=3)["usage"]["completion_tokens"] == 3,
              "the next request was not served")


TESTS = [test_completions_are_deterministic, test_stream_arrives_token_by_token,
         test_metrics_move_under_load, test_prefix_cache_hit_skips_prefill, test_lora_adapters,
         test_bad_requests_get_clear_errors, test_health_is_503_until_loaded,
         test_sigterm_drains_in_flight_streams, test_client_disconnect_frees_the_sequence]


def main():
    if subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode:
        print(f"FAIL: {TORCH_PYTHON} cannot import torch (scripts/deps.sh installs "
              "python3-torch)", flush=True)
        sys.exit(1)
    wanted = sys.argv[1:]
    failures = 0
    for test in [t for t in TESTS if not wanted or t.__name__ in wanted]:
        started = time.monotonic()
        try:
            test()
            print(f"PASS {test.__name__} ({time.monotonic() - started:.1f} s)", flush=True)
        except Exception as error:  # noqa: BLE001 - report every kind of failure, then go on
            failures += 1
            print(f"FAIL {test.__name__}: {type(error).__name__}: {error}", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
