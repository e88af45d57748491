"""What an export is on disk: the graph contract (mla_graph.json and its schema), the files
and paths it names, bounded JSON reading, the KV cache's row formats and the weight formats."""
