"""dev/hf.py's parts: our model file (ourfile), config.json's fields (fields), a checkpoint's tensors
(weights), one module per family (gpt2; llama, with moe for its MoE models). The package is not named hf: the tests
import dev/hf.py as hf."""
