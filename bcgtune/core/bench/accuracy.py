"""When a graph replay counts as agreeing with eager: the thresholds every validation uses
(the torch engine's `validate` and `validate --server` against a live SGLang server).

A token whose top-1 differs between replay and eager, or whose eager top-1 logprob moves by
more than MAX_LOGPROB_DELTA, is a failure only where eager's top-1/top-2 logit gap exceeds
GAP_THRESHOLD: below it, bf16 rounding alone flips the order (vLLM issue #55944 saw flips
only below a gap of ~0.7)."""

GAP_THRESHOLD = 0.7
MAX_LOGPROB_DELTA = 0.5
