"""An ELECTRA `TextClassifier` for keras-hub, which ships none: importing this module makes
`keras_hub.models.TextClassifier.from_preset(ELECTRA preset, num_classes=N)` build one:
keras-hub finds a task's subclass among Keras' registered custom objects whose `backbone_cls`
is the preset's backbone, hence the registrations. Needs the `keras-hub` extra."""

import keras
from keras_hub.models import (ElectraBackbone, ElectraTokenizer, TextClassifier,
                              TextClassifierPreprocessor)


@keras.saving.register_keras_serializable(package="electra_tf")
class ElectraTextClassifierPreprocessor(TextClassifierPreprocessor):
    backbone_cls = ElectraBackbone
    tokenizer_cls = ElectraTokenizer


@keras.saving.register_keras_serializable(package="electra_tf")
class ElectraTextClassifier(TextClassifier):
    """ELECTRA's classification head (the paper's appendix, finetune/model.py): the [CLS]
    vector of the sequence output -> dropout -> dense(num_classes) logits (not keras-hub's
    `pooled_output`). A preprocessor longer than the backbone's positions is cut to them."""

    backbone_cls = ElectraBackbone
    preprocessor_cls = ElectraTextClassifierPreprocessor

    def __init__(self, backbone, num_classes, preprocessor=None, activation=None,
                 dropout=0.1, **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        if preprocessor is not None and preprocessor.sequence_length > backbone.max_sequence_length:
            preprocessor.sequence_length = backbone.max_sequence_length
        self.output_dropout = keras.layers.Dropout(dropout, dtype=backbone.dtype_policy,
                                                   name="output_dropout")
        self.output_dense = keras.layers.Dense(
            num_classes, activation=activation, dtype=backbone.dtype_policy,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02), name="logits")
        inputs = backbone.input
        x = backbone(inputs)["sequence_output"][:, 0, :]
        outputs = self.output_dense(self.output_dropout(x))
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.num_classes = num_classes
        self.activation = keras.activations.get(activation)
        self.dropout = dropout

    def get_config(self):
        config = super().get_config()
        config.update({"num_classes": self.num_classes, "dropout": self.dropout,
                       "activation": keras.activations.serialize(self.activation)})
        return config
