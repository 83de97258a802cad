"""The outside world, translated into core types. One sub-package per world:

- `adapters.sglang`: SGLang itself (its logs, its flags, asking the installed SGLang in
  a child process and caching its answers, reading its runner's source, launching and
  driving its server);
- `adapters.bench_serving`: SGLang's benchmark client (its request draws, and the offline
  simulation that plays it against the scheduler model);
- `adapters.machine`: this machine (Python, torch and sglang installed, GPUs a profile
  names, a model's config.json found locally).

Adapters import core/ and files/ and each other's sub-packages; never services/ or cli/.
"""
