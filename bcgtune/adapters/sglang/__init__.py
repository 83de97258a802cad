"""SGLang's world: its scheduler logs (`log`), its launch flags (`flags`, `layout_flags`),
asking the installed SGLang in a child process (`resolve`, which runs `probe`) with a
cache of its answers (`answer_cache`), reading a prefill runner's source (`runner_source`),
and its server run as a supervised child (`launcher`, `live`, `live_validate`). bcgtune
never imports SGLang in its own process."""
