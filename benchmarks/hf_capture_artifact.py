"""The transformers-model capture artifact, before and after bcgtune's fix, on a GPU.

A Qwen3-8B-shaped transformers Qwen3ForCausalLM with random bf16 weights (from config, no
download). For each N: eager time, capture, replay time, max |logit| difference replay vs
eager, and the SDPA calls recorded in eager and in capture.
  before: attn_implementation="sdpa" (transformers' own), no SDPA pin (as the first probe ran)
  after:  bcgtune's causal SDPA (no mask, is_causal=True, in-kernel GQA), flash pinned

    PYTHONPATH=. python3 benchmarks/hf_capture_artifact.py --out-json FILE
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="256,1024,2048,4096,8192")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out-json")
    args = ap.parse_args()

    import torch
    import transformers

    from bcgtune.engines import hf
    from bcgtune.engines.build import _probe_native_gqa
    from bcgtune.engines.compare import compare_logits
    from bcgtune.engines.full import FullPrefillEngine
    from bcgtune.engines.inputs import text_inputs
    from bcgtune.engines.runtime import environment

    dev = torch.device("cuda")
    cfg = transformers.Qwen3Config(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=args.layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1e6,
    )
    tmp = tempfile.mkdtemp()
    cfg.save_pretrained(tmp)
    native = _probe_native_gqa(dev, torch.bfloat16, "flash")
    model = hf.load_hf_model(tmp, dev, torch.bfloat16, fix_attention=False, random_weights=True, native_gqa=native)
    hf.register_attention()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for label, impl, pin in (("before", "sdpa", "none"), ("after", hf.ATTN_NAME, "auto")):
        if hasattr(model.lm, "set_attn_implementation"):
            model.lm.set_attn_implementation(impl)
        else:
            model.lm.config._attn_implementation = impl
        model.attention_impl = impl
        for n in sizes:
            eng = FullPrefillEngine(model, dev, n, sdpa_backend=pin)
            x = text_inputs(model, n, dev, seed=n)
            te = eng.time_eager(x, 2, args.repeats).median_ms
            rec = eng.capture([n])[0]
            row = {
                "fix": label,
                "attn_implementation": impl,
                "sdpa_pin": pin,
                "n": n,
                "eager_ms": te,
                "capture_ok": rec.ok,
                "error": rec.error,
                "attention_eager": rec.attention_eager,
                "attention_capture": rec.attention_capture,
                "attention_match": rec.attention_match,
            }
            if rec.ok:
                row["replay_ms"] = eng.time_replay(x, n, 2, args.repeats).median_ms
                he, le = eng.eager(x)
                he, le = he.clone(), le.clone()
                hr, lr, _ = eng.replay(x, n)
                c = compare_logits(model, he, hr, le, lr)
                row.update(
                    max_abs_logit_diff=c.max_abs_diff,
                    last_logit_diff=c.last_logits_max_abs_diff,
                    top1_agree=c.top1_agree,
                )
            rows.append(row)
            print(
                f"{label:6s} n={n:5d} eager {te:8.2f} ms  replay {row.get('replay_ms', float('nan')):8.2f} ms  "
                f"max|dlogit| {row.get('max_abs_logit_diff', float('nan')):.4f}  attn eager={rec.attention_eager} "
                f"capture={rec.attention_capture}",
                flush=True,
            )
            eng.release()
            del eng
    out = {
        "environment": environment(dev).to_json(),
        "transformers": transformers.__version__,
        "layers": args.layers,
        "rows": rows,
    }
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
