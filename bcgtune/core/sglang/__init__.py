"""SGLang's own rules, each copied from the SGLang file it cites: the default prefill
ladder and capture alignment (`ladder`), what a whole launch captures (`capture`, with
`model_rules` and the `tables` read from SGLang's source by
scripts/extract_sglang_tables.py), the prefill runner's multimodal gate (`runner_gate`)
and the defaults the command line declares (`constants`). Imports only the core's shared
modules: every other domain may read SGLang's rules, these rules read no other domain."""
