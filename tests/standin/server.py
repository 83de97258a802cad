"""Stand-in for `python -m sglang.launch_server`, for bcgtune's live tests only (not shipped).

    python tests/standin/server.py --model-path DIR --port 30123 --cuda-graph-bs-prefill 64 128 ...

It honours the launch flags bcgtune passes (unknown ones are tolerated, as a newer SGLang's
would be), serves the HTTP routes that bcgtune and `sglang.benchmark.serving` call
(/health, /health_generate, /get_model_info, /model_info, /server_info, /v1/models,
/generate, /v1/completions, /v1/chat/completions, /flush_cache), and prints SGLang 0.5.23
log lines: the prefill capture begin/end pair at start, one `Prefill batch, ...` line per
prefill batch with `cuda graph: True/False` decided by SGLang's replay rule on the buckets
it was given, and a `Decode batch, ...` line every --decode-log-interval decode steps.

Scheduler model (a single thread, like SGLang's): each iteration forms a prefill batch from
waiting requests (a continuing chunked request first, then FCFS, stopped by
--max-running-requests and cut at --chunked-prefill-size), else runs one decode step for
every running request. Requests that arrive within STANDIN_BATCH_WINDOW_MS of the first
waiting one join the same batch.

Model: a fake, deterministic one. The next token and its top logprobs come from a hash of
the context (prompt token ids, image bytes, generated ids), so graphs-on and graphs-off
runs agree; STANDIN_GRAPH_NOISE adds a perturbation to the logits of replayed prefills
(small: logprob deltas; large: top-1 flips). Image inputs count as Qwen3-VL visual tokens
(smart_resize to multiples of 32, (H/32)*(W/32) + 2).

Multimodal gate (Qwen4-Exp under breakable graphs, see shared/docs/sglang-facts.md):
STANDIN_RUNNER=unpatched (default, as 0.5.23 ships): image batches never replay;
STANDIN_RUNNER=patched: image batches replay unless --speculative-algorithm is set.

Latency model (seconds, times STANDIN_TIME_SCALE, default 1): a prefill costs
0.002 + 4e-6 * tokens when eager and 0.6x that when replayed; a decode step costs
0.002 + 5e-5 * running requests.

Failure knobs: STANDIN_FAIL_AT_START="message" prints the message as SGLang would and
exits 1 before serving; STANDIN_DIE_AFTER_REQUESTS=N exits (code 137-like, os._exit(1))
after N generation requests were received (the N-th is not answered).
STANDIN_PID_FILE=path: the server writes its pid there once it serves.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import math
import os
import queue
import random
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from bcgtune.core.sglang.ladder import sglang_default_ladder  # noqa: E402
from bcgtune.core.sglang.replay import assign_buckets  # noqa: E402

RANK = ""  # " TP0" when --tp-size > 1, as SGLang's prefix carries rank parts then


def log(msg: str) -> None:
    sys.stdout.write(time.strftime("[%Y-%m-%d %H:%M:%S") + RANK + "] " + msg + "\n")
    sys.stdout.flush()


def parse_flags(argv):
    p = argparse.ArgumentParser(prog="standin-sglang", allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path", default="standin-model")
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--cuda-graph-backend-prefill", default="breakable", choices=["full", "breakable", "disabled"])
    p.add_argument("--cuda-graph-bs-prefill", type=int, nargs="+", default=None)
    p.add_argument("--cuda-graph-max-bs-prefill", type=int, default=None)
    p.add_argument("--disable-prefill-cuda-graph", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--chunked-prefill-size", type=int, default=2048)
    p.add_argument("--max-prefill-tokens", type=int, default=16384)
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    args, unknown = p.parse_known_args(argv)
    return args, unknown


class Tokenizer:
    """The model folder's tokenizer.json when there is one (the tests build a tiny word-level
    one, shared with the benchmark client), else whitespace words hashed into 1000 ids."""

    def __init__(self, folder: str | None):
        self.tok = None
        self.vocab_size = 1000
        path = Path(folder) / "tokenizer.json" if folder else None
        if path is not None and path.is_file():
            from tokenizers import Tokenizer as HFTokenizer

            self.tok = HFTokenizer.from_file(str(path))
            self.vocab_size = self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        if self.tok is not None:
            return self.tok.encode(text, add_special_tokens=False).ids
        return [int(hashlib.md5(w.encode()).hexdigest()[:6], 16) % self.vocab_size for w in text.split()]

    def decode_one(self, tid: int) -> str:
        if self.tok is not None:
            return self.tok.id_to_token(tid) or f"w{tid}"
        return f"w{tid}"


def image_tokens(data: str) -> tuple[int, bytes]:
    """Qwen3-VL visual tokens of one image (patch 16, merge 2 -> 32 px cells) + 2."""
    raw = data
    if raw.startswith("data:"):
        raw = raw.split(",", 1)[1]
    try:
        blob = base64.b64decode(raw)
        from PIL import Image

        with Image.open(io.BytesIO(blob)) as im:
            w, h = im.size
    except Exception:
        blob, w, h = raw.encode(), 512, 512
    hh = max(32, round(h / 32) * 32)
    ww = max(32, round(w / 32) * 32)
    return (hh // 32) * (ww // 32) + 2, hashlib.sha256(blob).digest()


class Request:
    def __init__(self, ids, images, max_new, logprobs, top_n, ignore_eos):
        self.rid = uuid.uuid4().hex
        self.ids = ids
        self.image_digests = [d for _, d in images]
        self.prompt_len = len(ids) + sum(n for n, _ in images)
        self.has_images = bool(images)
        self.max_new = max(1, int(max_new))
        self.logprobs = logprobs
        self.top_n = int(top_n or 0)
        self.prefilled = 0
        self.out_ids: list[int] = []
        self.out_lp: list = []
        self.out_top: list = []
        self.noise = 0.0
        self.events: queue.Queue = queue.Queue()
        self.arrival = time.monotonic()


class Engine:
    def __init__(self, args, tokenizer: Tokenizer):
        self.args = args
        self.tok = tokenizer
        self.scale = float(os.environ.get("STANDIN_TIME_SCALE", "1"))
        self.window = float(os.environ.get("STANDIN_BATCH_WINDOW_MS", "5")) / 1000.0
        self.noise = float(os.environ.get("STANDIN_GRAPH_NOISE", "0.001"))
        self.runner = os.environ.get("STANDIN_RUNNER", "unpatched")
        backend = "disabled" if args.disable_prefill_cuda_graph else args.cuda_graph_backend_prefill
        self.backend = backend
        if backend == "disabled":
            self.buckets: list[int] = []
        elif args.cuda_graph_bs_prefill:
            self.buckets = sorted(set(args.cuda_graph_bs_prefill))
        else:
            self.buckets = sglang_default_ladder(args.cuda_graph_max_bs_prefill or args.chunked_prefill_size)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.chunked: Request | None = None
        self.lock = threading.Condition()
        self.decode_steps = 0
        self.stopped = False

    # -- the model ----------------------------------------------------------------
    def next_token(self, req: Request, noise: float):
        h = hashlib.sha256()
        h.update(b"".join(i.to_bytes(4, "little") for i in req.ids))
        for d in req.image_digests:
            h.update(d)
        h.update(b"".join(i.to_bytes(4, "little") for i in req.out_ids))
        rng = random.Random(h.digest())
        k = max(5, req.top_n)
        cand = rng.sample(range(self.tok.vocab_size), min(k, self.tok.vocab_size))
        logits = sorted((rng.gauss(0, 2.0) for _ in cand), reverse=True)
        if noise:
            nrng = random.Random(h.digest() + b"graph")
            logits = [x + nrng.gauss(0, noise) for x in logits]
        m = max(logits)
        lse = m + math.log(sum(math.exp(x - m) for x in logits))
        scored = sorted(zip((x - lse for x in logits), cand), reverse=True)
        return scored

    def replays(self, n: int, has_images: bool) -> bool:
        if not self.buckets:
            return False
        _, ok = assign_buckets([n], self.buckets)
        if not bool(ok[0]):
            return False
        qwen_bcg = self.backend == "breakable"
        if has_images and qwen_bcg:
            if self.runner != "patched" or self.args.speculative_algorithm:
                return False
        return True

    # -- scheduling ---------------------------------------------------------------
    def submit(self, req: Request) -> None:
        with self.lock:
            self.waiting.append(req)
            self.lock.notify()

    def loop(self) -> None:
        while not self.stopped:
            with self.lock:
                while not (self.waiting or self.running or self.chunked):
                    self.lock.wait()
                has_wait = bool(self.waiting or self.chunked)
            if has_wait:
                first = self.chunked.arrival if self.chunked else min(r.arrival for r in self.waiting)
                delay = first + self.window - time.monotonic()
                if delay > 0 and self.chunked is None:
                    time.sleep(delay)
                if self.prefill_step():
                    continue
            if self.running:
                self.decode_step()

    def prefill_step(self) -> bool:
        a = self.args
        with self.lock:
            budget = a.chunked_prefill_size
            batch: list[tuple[Request, int]] = []
            if self.chunked is not None:
                req = self.chunked
                take = min(req.prompt_len - req.prefilled, budget)
                batch.append((req, take))
                budget -= take
                self.chunked = None if req.prefilled + take >= req.prompt_len else req
            room = a.max_running_requests - len(self.running) - len(batch)
            while self.waiting and budget > 0 and room > 0 and self.chunked is None:
                req = self.waiting.pop(0)
                take = min(req.prompt_len, budget)
                batch.append((req, take))
                budget -= take
                room -= 1
                if take < req.prompt_len:
                    self.chunked = req
            queued = len(self.waiting)
        if not batch:
            return False
        n = sum(t for _, t in batch)
        imgs = any(r.has_images for r, _ in batch)
        graph = self.replays(n, imgs)
        cost = (0.002 + 4e-6 * n) * (0.6 if graph else 1.0) * self.scale
        t0 = time.monotonic()
        time.sleep(cost)
        log(
            f"Prefill batch, #new-seq: {len(batch)}, #new-token: {n}, #cached-token: 0, "
            f"token usage: {min(0.99, 0.01 + 0.0001 * n):.2f}, #running-req: {len(self.running)}, "
            f"#queue-req: {queued}, #pending-token: 0, cuda graph: {graph}, "
            f"input throughput (token/s): {n / max(1e-6, time.monotonic() - t0):.2f}"
        )
        for req, take in batch:
            req.prefilled += take
            if graph:
                req.noise = self.noise
            if req.prefilled >= req.prompt_len:
                self.emit(req, self.next_token(req, req.noise))
                if len(req.out_ids) >= req.max_new:
                    self.finish(req)
                else:
                    with self.lock:
                        self.running.append(req)
        return True

    def decode_step(self) -> None:
        with self.lock:
            rows = list(self.running)
        if not rows:
            return
        time.sleep((0.002 + 5e-5 * len(rows)) * self.scale)
        self.decode_steps += 1
        for req in rows:
            self.emit(req, self.next_token(req, 0.0))
            if len(req.out_ids) >= req.max_new:
                with self.lock:
                    self.running.remove(req)
                self.finish(req)
        if self.decode_steps % max(1, self.args.decode_log_interval) == 0:
            log(
                f"Decode batch, #running-req: {len(rows)}, #token: {sum(r.prompt_len + len(r.out_ids) for r in rows)}, "
                f"token usage: 0.01, cuda graph: True, gen throughput (token/s): {len(rows) / 0.003:.2f}, "
                f"#queue-req: {len(self.waiting)}"
            )

    def emit(self, req: Request, scored) -> None:
        lp, tid = scored[0]
        req.out_ids.append(tid)
        req.out_lp.append([lp, tid, None])
        req.out_top.append([[x, t, None] for x, t in scored[: req.top_n]] if req.top_n else None)
        req.events.put(("token", tid))

    def finish(self, req: Request) -> None:
        req.events.put(("done", None))


# ---- HTTP ----------------------------------------------------------------------------
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "standin-sglang/0.5.23"
    engine: Engine
    counter = {"n": 0}
    counter_lock = threading.Lock()

    def log_message(self, fmt, *a):  # SGLang logs requests at a debug level only
        pass

    def _json(self, obj, code=200):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw or b"{}")

    def do_GET(self):
        e = self.engine
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            return self._json({})
        if path in ("/get_model_info", "/model_info"):
            return self._json(
                {
                    "model_path": e.args.model_path,
                    "tokenizer_path": e.args.tokenizer_path or e.args.model_path,
                    "is_generation": True,
                }
            )
        if path in ("/server_info", "/get_server_info"):
            return self._json(
                {
                    "model_path": e.args.model_path,
                    "cuda_graph_backend_prefill": e.backend,
                    "cuda_graph_bs_prefill": e.buckets,
                    "chunked_prefill_size": e.args.chunked_prefill_size,
                    "internal_states": [{}],
                    "version": "0.5.23-standin",
                }
            )
        if path == "/v1/models":
            name = e.args.served_model_name or e.args.model_path
            return self._json({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "sglang"}]})
        return self._json({"error": "not found"}, 404)

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        try:
            body = self._body()
        except (ValueError, json.JSONDecodeError):
            return self._json({"error": "bad json"}, 400)
        if path == "/flush_cache":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path not in ("/generate", "/v1/chat/completions", "/v1/completions"):
            return self._json({"error": "not found"}, 404)
        self._count_and_maybe_die()
        e = self.engine
        if path == "/generate":
            text = body.get("text") or ""
            ids = body.get("input_ids") or e.tok.encode(text)
            sp = body.get("sampling_params") or {}
            imgs = body.get("image_data") or []
            imgs = [imgs] if isinstance(imgs, str) else imgs
            req = Request(
                ids,
                [image_tokens(x) for x in imgs],
                sp.get("max_new_tokens", 16),
                body.get("return_logprob", False),
                body.get("top_logprobs_num", 0),
                sp.get("ignore_eos"),
            )
            e.submit(req)
            if body.get("stream"):
                return self._stream_native(req)
            self._wait(req)
            return self._json(self._native_obj(req))
        # OpenAI routes
        if path == "/v1/chat/completions":
            texts, imgs = [], []
            for m in body.get("messages") or []:
                c = m.get("content")
                if isinstance(c, str):
                    texts.append(c)
                elif isinstance(c, list):
                    for item in c:
                        if item.get("type") == "text":
                            texts.append(item.get("text", ""))
                        elif item.get("type") == "image_url":
                            imgs.append((item.get("image_url") or {}).get("url", ""))
            text = " ".join(texts)
        else:
            p = body.get("prompt") or ""
            text = p if isinstance(p, str) else " ".join(map(str, p))
            imgs = []
        max_new = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        req = Request(e.tok.encode(text), [image_tokens(x) for x in imgs], max_new, False, 0, body.get("ignore_eos"))
        e.submit(req)
        chat = path == "/v1/chat/completions"
        if body.get("stream"):
            return self._stream_openai(req, chat, body.get("model", ""))
        self._wait(req)
        out = " ".join(e.tok.decode_one(t) for t in req.out_ids)
        choice = {"index": 0, "finish_reason": "length"}
        choice.update({"message": {"role": "assistant", "content": out}} if chat else {"text": out})
        return self._json(
            {
                "id": req.rid,
                "object": "chat.completion" if chat else "text_completion",
                "model": body.get("model", ""),
                "choices": [choice],
                "usage": self._usage(req),
            }
        )

    def _count_and_maybe_die(self):
        limit = os.environ.get("STANDIN_DIE_AFTER_REQUESTS")
        with self.counter_lock:
            self.counter["n"] += 1
            n = self.counter["n"]
        if limit and n > int(limit):
            log("Scheduler hit an exception: RuntimeError: standin asked to die (STANDIN_DIE_AFTER_REQUESTS)")
            sys.stdout.flush()
            os._exit(1)

    def _wait(self, req):
        while True:
            kind, _ = req.events.get()
            if kind == "done":
                return

    @staticmethod
    def _usage(req):
        return {
            "prompt_tokens": req.prompt_len,
            "completion_tokens": len(req.out_ids),
            "total_tokens": req.prompt_len + len(req.out_ids),
        }

    def _native_obj(self, req):
        e = self.engine
        meta = {
            "id": req.rid,
            "prompt_tokens": req.prompt_len,
            "completion_tokens": len(req.out_ids),
            "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": len(req.out_ids)},
        }
        if req.logprobs:
            meta["output_token_logprobs"] = list(req.out_lp)
            if req.top_n:
                meta["output_top_logprobs"] = list(req.out_top)
        return {"text": " ".join(e.tok.decode_one(t) for t in req.out_ids), "output_ids": list(req.out_ids), "meta_info": meta}

    def _start_sse(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _sse(self, obj):
        data = obj if isinstance(obj, str) else json.dumps(obj)
        self.wfile.write(b"data: " + data.encode() + b"\n\n")
        self.wfile.flush()

    def _stream_native(self, req):
        self._start_sse()
        try:
            while True:
                kind, _ = req.events.get()
                if kind == "done":
                    break
                self._sse(self._native_obj(req))
            self._sse("[DONE]")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _stream_openai(self, req, chat, model):
        e = self.engine
        self._start_sse()
        obj_kind = "chat.completion.chunk" if chat else "text_completion"
        try:
            while True:
                kind, tid = req.events.get()
                if kind == "done":
                    break
                piece = e.tok.decode_one(tid) + " "
                choice = {"index": 0, "finish_reason": None}
                choice.update({"delta": {"content": piece}} if chat else {"text": piece})
                self._sse({"id": req.rid, "object": obj_kind, "model": model, "choices": [choice]})
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"delta": {}} if chat else {"text": ""})
            self._sse({"id": req.rid, "object": obj_kind, "model": model, "choices": [choice], "usage": None})
            self._sse({"id": req.rid, "object": obj_kind, "model": model, "choices": [], "usage": self._usage(req)})
            self._sse("[DONE]")
        except (BrokenPipeError, ConnectionResetError):
            pass


def main(argv) -> int:
    args, unknown = parse_flags(argv)
    log(
        f"server_args=ServerArgs(model_path={args.model_path!r}, port={args.port}, "
        f"cuda_graph_backend_prefill={args.cuda_graph_backend_prefill!r}, standin=True, unknown_flags={unknown!r})"
    )
    fail = os.environ.get("STANDIN_FAIL_AT_START")
    if fail:
        log(f"Scheduler hit an exception: {fail}")
        return 1
    engine = Engine(args, Tokenizer(args.tokenizer_path or args.model_path))
    global RANK
    RANK = " TP0" if args.tp_size > 1 else ""
    if engine.buckets:
        t0 = time.monotonic()
        log(f"Capture target prefill CUDA graph begin. backend={engine.backend}, num_tokens={engine.buckets}, avail mem=71.23 GB")
        time.sleep(0.001 * len(engine.buckets) * engine.scale)
        log(
            f"Capture target prefill CUDA graph end. elapsed={time.monotonic() - t0:.2f} s, "
            f"mem usage={0.02 * len(engine.buckets):.2f} GB, avail mem={71.23 - 0.02 * len(engine.buckets):.2f} GB."
        )
    Handler.engine = engine
    try:
        httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as exc:
        log(f"Error: cannot bind {args.host}:{args.port}: {exc.strerror}")
        return 1
    httpd.daemon_threads = True
    threading.Thread(target=engine.loop, daemon=True, name="scheduler").start()

    def bye(signum, _frame):
        log(f"Received sig {signum}, shutting down.")
        sys.stdout.flush()
        os._exit(0)

    signal.signal(signal.SIGTERM, bye)
    signal.signal(signal.SIGINT, bye)
    pid_file = os.environ.get("STANDIN_PID_FILE")
    if pid_file:
        Path(pid_file).write_text(f"{os.getpid()}\n")
    log("The server is fired up and ready to roll!")
    httpd.serve_forever(poll_interval=0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
