"""`tools/bench_serve.py`: a load generator speaking vLLM's `vllm bench serve` protocol (random
dataset, streamed /v1/completions, the same metrics and result field names) against any
OpenAI-compatible server, `mla-export serve` and llama.cpp's `llama-server` alike.

dataset.py: random text prompts of a target token length; sse.py: the server-sent-event stream
of one response; client.py: one streamed request, timed; metrics.py: vLLM's metrics from the
timed requests; runner.py: arrivals, concurrency, warm-ups, the A/B sweep; report.py: the
summary over rounds and the Markdown table; cli.py: the command line."""
