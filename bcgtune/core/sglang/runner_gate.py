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
  refuses-text     a text batch runs eager too (with speculative decoding off, on, or
                   both): no Qwen4-Exp prefill replays there, image or text; what images do
                   where text replays is said beside it
  unknown          the runner did not answer every question
  not checked      the runner was not run: SGLang is absent or was not asked, or the copy
                   does not import or cannot be run here (the reason is given; what its
                   source reads as may be reported beside it, never as a verdict)
  unimportable     (older answers) the runner module does not import
  absent           the source has no multimodal refusal at all
"""

from __future__ import annotations

from typing import Literal

GateState = Literal[
    "patched", "unpatched", "refusal-removed", "inverted", "refuses-text", "absent", "unknown", "not checked", "unimportable"
]
GATE_QUESTIONS = ("image_spec_off", "image_spec_on", "text_spec_off", "text_spec_on")


def _images(img_off: bool, img_on: bool) -> tuple[GateState, str]:
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


def classify_gate(answers: dict[str, bool]) -> tuple[GateState, str]:
    """(state, detail) from the runner's answers for a Qwen4-Exp image batch and a text
    batch, with speculative decoding off and on."""
    if any(q not in answers for q in GATE_QUESTIONS):
        return "unknown", "the runner did not answer every question"
    text_off, text_on = answers["text_spec_off"], answers["text_spec_on"]
    if text_off and text_on:
        return _images(answers["image_spec_off"], answers["image_spec_on"])
    where = {
        (False, True): "with speculative decoding off",
        (True, False): "with speculative decoding on",
        (False, False): "with speculative decoding off and on",
    }[(text_off, text_on)]
    detail = f"a Qwen4-Exp text batch runs eager {where}: no Qwen4-Exp prefill batch replays there"
    if text_off:
        detail += f"; off, image batches {'replay' if answers['image_spec_off'] else 'run eager'}"
    if text_on:
        detail += f"; on, image batches {'replay' if answers['image_spec_on'] else 'run eager'}"
    return "refuses-text", detail
