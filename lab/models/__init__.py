"""Models built from the kernel families (the seq2seq GRU encoder-decoder)."""
