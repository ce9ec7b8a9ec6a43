"""A small BERT-style transformer encoder, TF 1.15 style (TF 1 shape idioms throughout)."""

import collections
import copy
import json
import math
import re

from estimator_tpu.compat import tf


class BertConfig(object):
  """Sizes of the encoder."""

  def __init__(self, vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
               hidden_dropout_prob=0.1, initializer_range=0.02):
    self.vocab_size = vocab_size
    self.hidden_size = hidden_size
    self.num_hidden_layers = num_hidden_layers
    self.num_attention_heads = num_attention_heads
    self.intermediate_size = intermediate_size
    self.max_position_embeddings = max_position_embeddings
    self.type_vocab_size = type_vocab_size
    self.hidden_dropout_prob = hidden_dropout_prob
    self.initializer_range = initializer_range

  @classmethod
  def from_json_file(cls, json_file):
    with tf.gfile.GFile(json_file, "r") as reader:
      return cls(**json.loads(reader.read()))

  def to_json_string(self):
    return json.dumps(copy.deepcopy(self.__dict__), indent=2, sort_keys=True)


def get_shape_list(tensor, expected_rank=None):
  """Static dimensions where known, dynamic ones elsewhere (TF 1: Dimension.value)."""
  if expected_rank is not None and tensor.shape.ndims != expected_rank:
    raise ValueError("Tensor %s has rank %d, expected %d" %
                     (tensor.name, tensor.shape.ndims, expected_rank))
  shape = []
  dynamic = tf.shape(tensor)
  for index, dim in enumerate(tensor.shape):
    assert isinstance(dim, tf.Dimension)
    shape.append(dim.value if dim.value is not None else dynamic[index])
  return shape


def create_initializer(initializer_range=0.02):
  return tf.truncated_normal_initializer(stddev=initializer_range)


def layer_norm(input_tensor, name=None):
  return tf.contrib.layers.layer_norm(
      inputs=input_tensor, begin_norm_axis=-1, begin_params_axis=-1, scope=name)


def dropout(input_tensor, dropout_prob):
  if dropout_prob is None or dropout_prob == 0.0:
    return input_tensor
  return tf.nn.dropout(input_tensor, 1.0 - dropout_prob)


def gelu(x):
  return 0.5 * x * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))


def embeddings(input_ids, token_type_ids, config):
  """Word + token type + position embeddings, layer-normalized."""
  batch_size, seq_length = get_shape_list(input_ids, expected_rank=2)
  word_table = tf.get_variable(
      "word_embeddings", [config.vocab_size, config.hidden_size],
      initializer=create_initializer(config.initializer_range))
  output = tf.gather(word_table, input_ids)
  type_table = tf.get_variable(
      "token_type_embeddings", [config.type_vocab_size, config.hidden_size],
      initializer=create_initializer(config.initializer_range))
  output += tf.gather(type_table, token_type_ids)
  position_table = tf.get_variable(
      "position_embeddings", [config.max_position_embeddings, config.hidden_size],
      initializer=create_initializer(config.initializer_range))
  positions = tf.slice(position_table, [0, 0], [seq_length, -1])
  output += tf.expand_dims(positions, 0)
  return word_table, layer_norm(output, "LayerNorm")


def attention_layer(layer_input, attention_mask, config):
  """Multi-head self-attention over [batch, seq, hidden]."""
  batch_size, seq_length, width = get_shape_list(layer_input, expected_rank=3)
  heads = config.num_attention_heads
  size_per_head = layer_input.shape[-1].value // heads

  def project(name):
    projected = tf.layers.dense(layer_input, width, name=name,
                                kernel_initializer=create_initializer(config.initializer_range))
    projected = tf.reshape(projected, [batch_size, seq_length, heads, size_per_head])
    return tf.transpose(projected, [0, 2, 1, 3])

  query, key, value = project("query"), project("key"), project("value")
  scores = tf.matmul(query, key, transpose_b=True) * (1.0 / math.sqrt(float(size_per_head)))
  adder = (1.0 - tf.cast(attention_mask[:, None, None, :], tf.float32)) * -10000.0
  probs = dropout(tf.nn.softmax(scores + adder), config.hidden_dropout_prob)
  context = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])
  return tf.reshape(context, [batch_size, seq_length, width])


def transformer_layer(layer_input, attention_mask, config):
  with tf.variable_scope("attention"):
    with tf.variable_scope("self"):
      attended = attention_layer(layer_input, attention_mask, config)
    with tf.variable_scope("output"):
      attended = tf.layers.dense(attended, config.hidden_size,
                                 kernel_initializer=create_initializer())
      attended = layer_norm(dropout(attended, config.hidden_dropout_prob) + layer_input)
  with tf.variable_scope("intermediate"):
    intermediate = tf.layers.dense(attended, config.intermediate_size, activation=gelu,
                                   kernel_initializer=create_initializer())
  with tf.variable_scope("output"):
    output = tf.layers.dense(intermediate, config.hidden_size,
                             kernel_initializer=create_initializer())
    return layer_norm(dropout(output, config.hidden_dropout_prob) + attended)


class BertModel(object):
  """Embeddings, transformer layers and a tanh pooler over the first token."""

  def __init__(self, config, is_training, input_ids, input_mask, token_type_ids, scope=None):
    config = copy.deepcopy(config)
    if not is_training:
      config.hidden_dropout_prob = 0.0
    with tf.variable_scope(scope, default_name="bert"):
      with tf.variable_scope("embeddings"):
        self.embedding_table, output = embeddings(input_ids, token_type_ids, config)
      with tf.variable_scope("encoder"):
        for index in range(config.num_hidden_layers):
          with tf.variable_scope("layer_%d" % index):
            output = transformer_layer(output, input_mask, config)
      self.sequence_output = output
      with tf.variable_scope("pooler"):
        first_token = tf.squeeze(self.sequence_output[:, 0:1, :], axis=1)
        self.pooled_output = tf.layers.dense(
            first_token, config.hidden_size, activation=tf.tanh,
            kernel_initializer=create_initializer(config.initializer_range))

  def get_pooled_output(self):
    return self.pooled_output

  def get_sequence_output(self):
    return self.sequence_output


def get_assignment_map_from_checkpoint(tvars, init_checkpoint):
  """The variables of tvars that init_checkpoint holds, by name; and those names."""
  name_to_variable = collections.OrderedDict()
  for var in tvars:
    match = re.match("^(.*):\\d+$", var.name)
    name_to_variable[match.group(1) if match else var.name] = var
  assignment_map = collections.OrderedDict()
  initialized_variable_names = {}
  for name, _ in tf.train.list_variables(init_checkpoint):
    if name in name_to_variable:
      assignment_map[name] = name
      initialized_variable_names[name] = 1
      initialized_variable_names[name + ":0"] = 1
  return assignment_map, initialized_variable_names
