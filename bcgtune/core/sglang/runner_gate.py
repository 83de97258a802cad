"""The prefill runner's multimodal gate, classified from its answers: whether a Qwen4-Exp
(Qwen3.8-Flash-Next) image batch and a text batch replay under breakable graphs, with
speculative decoding off and on (SGLang's can_replay_locally,
srt/model_executor/runner/prefill_cuda_graph_runner.py).

  patched          images replay without speculative decoding, stay eager with it
                   (the multimodal breakable-prefill patch)
  unpatched        every image batch runs eager
  refusal-removed  images replay even under speculative decoding, which the patch
                   exists to prevent (the draft runner still refuses them)
  inverted         images replay only under speculative decoding
  unknown          the answers say nothing about images (a text batch did not replay
                   either), or the runner could not be asked or read
  unverified       the runner was not run, only its source read (what it reads as is
                   reported beside it; a reading never blocks)
  unimportable     the runner module does not import: the server would not start
  absent           the source has no multimodal refusal at all
"""

from __future__ import annotations

from typing import Literal

GateState = Literal["patched", "unpatched", "refusal-removed", "inverted", "absent", "unknown", "unverified", "unimportable"]
GATE_QUESTIONS = ("image_spec_off", "image_spec_on", "text_spec_off", "text_spec_on")


def classify_gate(answers: dict[str, bool]) -> tuple[GateState, str]:
    """(state, detail) from the runner's answers for a Qwen4-Exp image batch and a text
    batch, with speculative decoding off and on."""
    if any(q not in answers for q in GATE_QUESTIONS):
        return "unknown", "the runner did not answer every question"
    if not (answers["text_spec_off"] and answers["text_spec_on"]):
        return "unknown", "a text batch did not replay either, so the answers say nothing about images"
    img_off, img_on = answers["image_spec_off"], answers["image_spec_on"]
    if img_off and not img_on:
        return "patched", "image batches replay unless speculative decoding is on"
    if not img_off and not img_on:
        return "unpatched", "every Qwen4-Exp image batch runs eager under breakable graphs"
    if img_off and img_on:
        return (
            "refusal-removed",
            "image batches replay even under speculative decoding, where the draft runner refuses them "
            "(ranks can split between replay and eager)",
        )
    return "inverted", "image batches replay only under speculative decoding"
