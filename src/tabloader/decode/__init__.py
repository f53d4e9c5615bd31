"""Reading, in one place: a dataset's pieces decoded into the arrays the backends lay out.

- `tabloader.decode.host`: pyarrow decodes, numpy holds the columns (nulls filled or
  refused, lists as values and offsets, vectors as ``[rows, k]``), for the CPU backend
  and for filling a decoded cache;
- `tabloader.decode.gpu`: cudf or pylibcudf decodes into GPU memory, a chunk's reads
  planned on the host, the columns made cupy arrays as on the host
  (`tabloader.decode.gpu_columns`), for the GPU backend and for the ids an embedding
  table spans.

Both deliver the same values for the same rows, nulls and NaN alike, so the backends
differ only in where the arrays live.
"""
