# %% [markdown]
# # From a Parquet dataset to a kNN graph in your own ids
#
# Embeddings as an LLM data pipeline or a Hugging Face dataset keeps them: several Parquet files, each with a
# float16 `emb` column (a fixed-size list) and a string `doc_id` column. bigknn builds the graph from the files as
# they are (pyarrow reads them a row group at a time), keeps the ids, folds in a file that arrives later, and
# writes the graph back as a Parquet edge list in those ids, for pandas, polars, DuckDB or Spark.
#
# Run it: `python examples/parquet_to_graph.py` (needs `pip install 'bigknn[parquet]'`); it writes into a new
# folder `parquet_demo/` of the current directory. The same commands on the CLI:
#
#     bigknn build parquet_demo/embeddings -o parquet_demo/docs.knn --column emb --id-column doc_id
#     bigknn ingest parquet_demo/docs.knn --input parquet_demo/late/part-003.parquet
#     bigknn export parquet_demo/docs.knn -o parquet_demo/edges.parquet --ids user

# %%
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import bigknn

root = Path("parquet_demo")
(root / "embeddings").mkdir(parents=True)
(root / "late").mkdir()

# 4 files of 1000 documents: 3 now, 1 later. Near-duplicates: each document has a twin, a slightly noisy copy.
rng = np.random.default_rng(0)
base = rng.normal(size=(2000, 32))
docs = np.concatenate([base, base + 0.01 * rng.normal(size=base.shape)]).astype(np.float16)
order = rng.permutation(len(docs))  # twins land in different files
docs, doc_ids = docs[order], np.array([f"doc-{i % 2000}-{'ab'[i // 2000]}" for i in order])


def write_part(path: Path, rows: slice) -> None:
    emb = pa.FixedSizeListArray.from_arrays(pa.array(docs[rows].ravel()), docs.shape[1])
    pq.write_table(pa.table({"doc_id": doc_ids[rows], "emb": emb}), path, row_group_size=250)


for i in range(3):
    write_part(root / "embeddings" / f"part-{i:03d}.parquet", slice(1000 * i, 1000 * (i + 1)))
write_part(root / "late" / "part-003.parquet", slice(3000, 4000))
print("files:", sorted(p.name for p in (root / "embeddings").iterdir()))

# %% Build from the directory: its files in sorted order are one dataset; the ids are kept in the store
g = bigknn.build(root / "embeddings", k=8, store=root / "docs.knn", column="emb", id_column="doc_id")
print(f"built: {g.info.rows} rows x {g.info.dim}")

# %% A file that arrives later: ingest it (its ids come along); ingesting it again changes nothing
report = g.ingest(root / "late" / "part-003.parquet")
again = g.ingest(root / "late" / "part-003.parquet")
print(f"ingested: {report.rows_added} rows, then {again.rows_added} on the repeat; {g.info.rows} rows in all")

# %% Neighbours in your ids: every document's nearest neighbour should be its twin
ids, dist = g.neighbors(k=1, ids="user")
# rows are numbered as the files were read: the build's three in sorted order, then the ingested one
twins = np.mean([a.rsplit("-", 1)[0] == b.rsplit("-", 1)[0] for a, b in zip(doc_ids, ids[:, 0])])
print(f"nearest neighbour is the twin: {twins:.3f}")

# %% The graph as a Parquet edge list in your ids: src, dst, distance, rank (1 = nearest)
g.export(root / "edges.parquet", ids="user")
edges = pq.read_table(root / "edges.parquet")
print(f"edges: {edges.num_rows} rows, columns {edges.column_names}")
print(edges.slice(0, 3).to_pylist())
g.close()
