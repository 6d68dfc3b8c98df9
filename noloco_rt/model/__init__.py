"""What is trained: the presets' Llama-style decoder cut into stages (llama.py), the
interface every trained model offers, presets and your own alike (staged.py: StagedModel),
torch.compile for a stage (compile_stage.py) and starting from given weights
(init_weights.py)."""
