"""SGLang's benchmark client, bench_serving: its requests drawn as it draws them
(`client`) and the offline simulation that plays them against the scheduler model in
core.sim (`simulator`)."""
