"""`noloco-rt prepare`: text files or JSONL -> token shards that data.source = "tokens" reads.

manifest   prepared.json: what a prepared directory holds; run_tokenizer_path(cfg)
documents  inputs and their documents (text files cut at blank lines, JSONL lines), the split
tokenizer  loading or training a Hugging Face tokenizer (imported lazily: it is slow to load)
state      the progress file that makes an interrupted run resumable, written atomically
packer     documents' token ids -> fixed-size train/val shard files
pipeline   the whole run: tokenize, pack, checkpoint, write the manifest
"""

from noloco_rt.config.prepared_manifest import (
           MANIFEST_NAME,
           Manifest,
           dtype_for_vocab,
           find_prepared_dir,
           read_manifest,
           run_tokenizer_path,
)

__all__ = ["MANIFEST_NAME", "Manifest", "dtype_for_vocab", "find_prepared_dir", "read_manifest",
           "run_tokenizer_path"]
