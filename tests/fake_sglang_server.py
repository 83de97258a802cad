"""Stand-in for `python -m sglang.launch_server` in lifecycle tests: prints SGLang-style
log lines, serves GET /health (200) on --port when given, spawns a grandchild (as SGLang
spawns its scheduler) so tests can check the whole group is reaped, and exits 0 on
SIGTERM/SIGINT. FAKE_EXIT_CODE=N makes it crash with code N after its first lines.
Writes its pids to FAKE_PID_FILE (leader, grandchild) when set."""

import http.server
import os
import signal
import subprocess
import sys
import threading
import time


def log(msg):
    print(time.strftime("[%Y-%m-%d %H:%M:%S] ") + msg, flush=True)


def main(argv):
    port = None
    if "--port" in argv:
        port = int(argv[argv.index("--port") + 1])
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pid_file = os.environ.get("FAKE_PID_FILE")
    if pid_file:
        with open(pid_file, "w") as fh:
            fh.write(f"{os.getpid()} {grandchild.pid}\n")

    def bye(signum, _frame):
        log(f"Received sig {signum}, shutting down")
        grandchild.terminate()
        grandchild.wait()
        sys.exit(0)

    handler = signal.SIG_IGN if os.environ.get("FAKE_IGNORE_SIGNALS") else bye  # a hung server
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    log("server_args=ServerArgs(model_path='fake', cuda_graph_backend_prefill='breakable')")
    log("Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[256, 512], avail mem=70.00 GB")
    log("Capture target prefill CUDA graph end. elapsed=0.01 s, mem usage=0.10 GB, avail mem=69.90 GB.")
    code = os.environ.get("FAKE_EXIT_CODE")
    if code is not None:
        log("RuntimeError: fake crash")
        grandchild.kill()
        sys.exit(int(code))
    if port is not None:

        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path == "/health" else 404)
                self.end_headers()

            def log_message(self, *a):
                pass

        srv = http.server.HTTPServer(("127.0.0.1", port), Health)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    log("The server is fired up and ready to roll!")
    n = 0
    while True:
        n += 1
        log(
            f"Prefill batch, #new-seq: 1, #new-token: {256 * n}, #cached-token: 0, token usage: 0.01, "
            f"#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: True, input throughput (token/s): 1000.00"
        )
        time.sleep(0.2)


if __name__ == "__main__":
    main(sys.argv[1:])
