"""The demo target: a small Llama trained offline on a synthetic reasoning corpus."""
