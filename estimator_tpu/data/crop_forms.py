"""The forms of the central crop that evaluation and serving take (--eval_crop_form).

SQUARE is tensorflow/tpu's ResNet and EfficientNet evaluation crop: a centred
square of the fraction of the shorter side, so the object keeps its aspect
ratio. PER_SIDE keeps the fraction of each side (tf.image.central_crop), which
the resize to a square then stretches; it is what a run saved before the
choice existed evaluates with. No TensorFlow here: the config (and so every
command's --help) reads these names; image_ops does the cropping.
"""

SQUARE = "square"
PER_SIDE = "per_side"
CROP_FORMS = (SQUARE, PER_SIDE)
