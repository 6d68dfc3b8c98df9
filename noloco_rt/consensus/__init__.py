"""The model a run has learned: the consensus file of the replicas' mean slow weights
(file.py), written and scored (scored.py), made to stand alone with its tokenizer
(standalone.py), and as a Hugging Face Llama folder (hf_format.py, both ways; hf_export.py)."""
