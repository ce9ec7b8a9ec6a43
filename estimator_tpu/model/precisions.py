"""The names of --precision's choices.

No TensorFlow here: the config (and so every command's --help) reads these
names; model/precision.py does what each means.
"""

FLOAT32 = "float32"
BFLOAT16 = "bfloat16"
FLOAT16 = "float16"
PRECISIONS = (FLOAT32, BFLOAT16, FLOAT16)
