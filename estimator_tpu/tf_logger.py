"""TensorFlow's Python log records, each printed once, in TensorFlow's own format.

TensorFlow's logger ("tensorflow") gets a handler of its own the first time it
is set up while the root logger has none, printing `INFO:tensorflow:message`
(TF 1.15's format); its records still propagate to the root logger. Anything
that configures the root logger afterwards prints every record a second time:
absl's `app.run` (TF 1 programs' `tf.app.run`) as `I1123 ... file.py:115]
message`, and absl's module-level `logging.info` before `app.run`, which calls
`logging.basicConfig()`, as a second `INFO:tensorflow:message`.
"""



def print_once():
  """Stops TensorFlow's records reaching the root logger where TF's own handler prints them.

  Where the root logger was configured before TensorFlow set up its logger,
  TensorFlow added no handler, and its records keep going to the root's
  handlers (once, in the format the program chose).

  Returns:
    TensorFlow's logger.
  """
  import tensorflow as tf
  logger = tf.get_logger()
  if logger.handlers:
    logger.propagate = False
  return logger


def info(message, *args):
  """Logs `message % args` at INFO on TensorFlow's logger, as TF 1 code's own records are."""
  print_once().info(message, *args)
