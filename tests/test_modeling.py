"""electra_tf.model.modeling: shapes, dtypes, masking, weight sharing, TF1 names, XLA, precision."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf import kernels
from electra_tf.model import modeling
from electra_tf.kernels import tensorflow as tf_kernels
from electra_tf.configs import ModelConfig, load_config

# E=32, H=64, 2 layers, V=1000; generator 1/4 -> hidden 16 (so it has its own projection).
TINY = ModelConfig(vocab_size=1000, embedding_size=32, hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=2, intermediate_size=256, max_position_embeddings=64,
                   generator_hidden_size=0.25)
B, L, P = 2, 16, 3


def _inputs(seed=0, batch=B, length=L, pad=4):
    rng = np.random.RandomState(seed)
    ids = rng.randint(5, TINY.vocab_size, size=(batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    mask[:, length - pad:] = 0
    ids[:, length - pad:] = 0
    seg = np.zeros((batch, length), np.int32)
    seg[:, length // 2:length - pad] = 1
    positions = np.stack([rng.choice(length - pad, P, replace=False)
                          for _ in range(batch)]).astype(np.int32)
    return ids, mask, seg, positions


@pytest.fixture(scope="module")
def tiny():
    return modeling.ElectraPretrainingModel(TINY)


def test_output_shapes_and_dtypes(tiny):
    ids, mask, seg, pos = _inputs()
    disc = tiny.discriminator(ids, mask, seg)
    hidden = tiny.discriminator_hidden(ids, mask, seg)
    gen = tiny.generator_mlm_logits(ids, mask, seg, pos)
    assert disc.shape == (B, L) and disc.dtype == tf.float32
    assert hidden.shape == (B, L, TINY.hidden_size)
    assert gen.shape == (B, P, TINY.vocab_size) and gen.dtype == tf.float32
    assert tiny.generator_hidden(ids, mask, seg).shape == (B, L, TINY.generator_hidden)
    # Logits are only computed at the masked positions, and they are the right ones.
    all_positions = np.tile(np.arange(L, dtype=np.int32), (B, 1))
    full = tiny.generator_mlm_logits(ids, mask, seg, all_positions).numpy()
    expected = np.take_along_axis(full, pos[:, :, None], axis=1)
    np.testing.assert_allclose(gen.numpy(), expected, rtol=1e-5, atol=1e-5)
    # Keras call() is the discriminator.
    np.testing.assert_allclose(tiny({"input_ids": ids, "input_mask": mask,
                                     "segment_ids": seg}).numpy(), disc.numpy(), atol=1e-6)
    # Sanity at initialisation: MLM loss ~ ln V.
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        np.take_along_axis(ids, pos, axis=1), gen))
    assert abs(float(loss) - np.log(TINY.vocab_size)) < 1.0


def test_inference_deterministic_training_stochastic(tiny):
    ids, mask, seg, pos = _inputs()
    a = tiny.discriminator(ids, mask, seg, training=False)
    b = tiny.discriminator(ids, mask, seg, training=False)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    g1 = tiny.generator_mlm_logits(ids, mask, seg, pos, training=False)
    g2 = tiny.generator_mlm_logits(ids, mask, seg, pos, training=False)
    np.testing.assert_array_equal(g1.numpy(), g2.numpy())
    t1 = tiny.discriminator(ids, mask, seg, training=True)
    t2 = tiny.discriminator(ids, mask, seg, training=True)
    assert np.abs(t1.numpy() - t2.numpy()).max() > 1e-3
    assert np.abs(t1.numpy() - a.numpy()).max() > 1e-3
    # A seed makes the dropout masks a pure function of it.
    s1 = tiny.discriminator(ids, mask, seg, training=True, seed=[1, 2])
    np.testing.assert_array_equal(
        s1.numpy(), tiny.discriminator(ids, mask, seg, training=True, seed=[1, 2]).numpy())
    assert np.abs(s1.numpy() - tiny.discriminator(ids, mask, seg, training=True,
                                                  seed=[1, 3]).numpy()).max() > 1e-3
    # Without dropout, training computes exactly what inference does.
    plain = modeling.ElectraPretrainingModel(dataclasses.replace(
        TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    _copy_weights(tiny, plain)
    np.testing.assert_array_equal(plain.discriminator(ids, mask, seg, training=True).numpy(),
                                  a.numpy())
    np.testing.assert_array_equal(
        plain.generator_mlm_logits(ids, mask, seg, pos, training=True).numpy(), g1.numpy())


def test_dropout_keeps_and_scales():
    x = tf.ones([200, 500])
    y = modeling.dropout(x, 0.25, True, seed=[7, 8]).numpy()
    assert set(np.unique(y).tolist()) == {0.0, np.float32(1 / 0.75)}
    assert abs((y > 0).mean() - 0.75) < 0.005  # 100k draws: std 0.0014
    np.testing.assert_array_equal(y, modeling.dropout(x, 0.25, True, seed=[7, 8]).numpy())
    assert modeling.dropout(x, 0.25, False) is x and modeling.dropout(x, 0.0, True) is x


def test_padding_does_not_leak_into_real_positions(tiny):
    ids, mask, seg, pos = _inputs(pad=5)
    other = ids.copy()
    other[:, -5:] = np.random.RandomState(7).randint(5, TINY.vocab_size, size=(B, 5))
    seg2 = seg.copy()
    seg2[:, -5:] = 1
    real = mask.astype(bool)
    for fn in (tiny.discriminator, tiny.discriminator_hidden, tiny.generator_hidden):
        x = fn(ids, mask, seg).numpy()
        y = fn(other, mask, seg2).numpy()
        np.testing.assert_allclose(x[real], y[real], rtol=1e-5, atol=1e-5)
        assert not np.allclose(x[~real], y[~real])
    np.testing.assert_allclose(tiny.generator_mlm_logits(ids, mask, seg, pos).numpy(),
                               tiny.generator_mlm_logits(other, mask, seg2, pos).numpy(),
                               rtol=1e-5, atol=1e-5)


def _encoder_names(scope, hidden, ffn, layers, E):
    out = {}
    if E != hidden:
        out[f"{scope}/embeddings_project/kernel"] = (E, hidden)
        out[f"{scope}/embeddings_project/bias"] = (hidden,)
    for i in range(layers):
        p = f"{scope}/encoder/layer_{i}"
        for qkv in ("query", "key", "value"):
            out[f"{p}/attention/self/{qkv}/kernel"] = (hidden, hidden)
            out[f"{p}/attention/self/{qkv}/bias"] = (hidden,)
        out[f"{p}/attention/output/dense/kernel"] = (hidden, hidden)
        out[f"{p}/attention/output/dense/bias"] = (hidden,)
        out[f"{p}/intermediate/dense/kernel"] = (hidden, ffn)
        out[f"{p}/intermediate/dense/bias"] = (ffn,)
        out[f"{p}/output/dense/kernel"] = (ffn, hidden)
        out[f"{p}/output/dense/bias"] = (hidden,)
        for ln in ("attention/output/LayerNorm", "output/LayerNorm"):
            out[f"{p}/{ln}/gamma"] = (hidden,)
            out[f"{p}/{ln}/beta"] = (hidden,)
    return out


def _embedding_names(scope, c):
    E = c.embedding_size
    return {f"{scope}/embeddings/word_embeddings": (c.vocab_size, E),
            f"{scope}/embeddings/position_embeddings": (c.max_position_embeddings, E),
            f"{scope}/embeddings/token_type_embeddings": (c.type_vocab_size, E),
            f"{scope}/embeddings/LayerNorm/gamma": (E,),
            f"{scope}/embeddings/LayerNorm/beta": (E,)}


def expected_tf1_layout(c: ModelConfig):
    """{TF1 name: shape} of a pre-training checkpoint, written from REFERENCE section 5."""
    E, H = c.embedding_size, c.hidden_size
    out = _embedding_names("electra", c)
    out.update(_encoder_names("electra", H, c.intermediate_size, c.num_hidden_layers, E))
    gen_hidden, head = H, "generator_predictions"
    if c.two_tower_generator:  # the official TwoTowerClozeTransformer's scopes
        for tower in ("generator_ltr", "generator_rtl"):
            if not c.tie_embeddings:
                out.update(_embedding_names(tower, c))
            out.update(_encoder_names(tower, c.generator_hidden, c.generator_intermediate,
                                      c.generator_num_layers, E))
        gen_hidden, head = 2 * c.generator_hidden, "cloze_predictions"
    elif not c.tie_all_weights:
        gen_hidden = c.generator_hidden
        if not c.tie_embeddings:
            out.update(_embedding_names("generator", c))
        out.update(_encoder_names("generator", gen_hidden, c.generator_intermediate,
                                  c.generator_num_layers, E))
    out.update({
        f"{head}/dense/kernel": (gen_hidden, E),
        f"{head}/dense/bias": (E,),
        f"{head}/LayerNorm/gamma": (E,),
        f"{head}/LayerNorm/beta": (E,),
        f"{head}/output_bias": (c.vocab_size,),
        "discriminator_predictions/dense/kernel": (H, H),
        "discriminator_predictions/dense/bias": (H,),
        "discriminator_predictions/dense_1/kernel": (H, 1),
        "discriminator_predictions/dense_1/bias": (1,),
    })
    return out


def _check_name_map(model, cfg, show=False):
    names = {v.path: name for name, v in modeling.tf1_variables(model).items()}
    variables = model.trainable_variables
    assert len({id(v) for v in variables}) == len(variables)
    assert set(names) == {v.path for v in variables}, "every trainable variable is mapped"
    assert len(set(names.values())) == len(names), "the map is 1:1"
    got = {names[v.path]: tuple(v.shape) for v in variables}
    expected = expected_tf1_layout(cfg)
    assert sorted(set(expected) - set(got)) == [] and sorted(set(got) - set(expected)) == []
    assert got == expected
    # The scheme: the Keras variable path IS the TF1 name.
    assert all(path == name for path, name in names.items())
    if show:
        for path in names:
            print(f"{path:64s} {list(got[names[path]])}")
    return got


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["small", "base", "large"])
def test_tf1_name_map_presets(preset):
    cfg = load_config(preset).model
    model = modeling.ElectraPretrainingModel(cfg)  # builds variables only, no forward pass
    print(f"\n--- {preset}: our variable path -> TF1 checkpoint name (identical) [shape]")
    got = _check_name_map(model, cfg, show=(preset == "small"))
    E, H, V = cfg.embedding_size, cfg.hidden_size, cfg.vocab_size
    last = cfg.num_hidden_layers - 1
    gh = cfg.generator_hidden
    assert got["electra/embeddings/word_embeddings"] == (V, E)
    assert got[f"electra/encoder/layer_{last}/attention/self/query/kernel"] == (H, H)
    assert got[f"generator/encoder/layer_{last}/attention/self/query/kernel"] == (gh, gh)
    assert got["generator_predictions/dense/kernel"] == (gh, E)
    assert got["generator_predictions/output_bias"] == (V,)
    assert got["discriminator_predictions/dense_1/kernel"] == (H, 1)
    if preset == "small":
        assert got["electra/embeddings/word_embeddings"] == (30522, 128)
        assert got["electra/embeddings_project/kernel"] == (128, 256)
        assert got["generator/embeddings_project/kernel"] == (128, 64)
        assert got["electra/encoder/layer_11/attention/self/query/kernel"] == (256, 256)
        assert got["generator/encoder/layer_11/attention/self/query/kernel"] == (64, 64)
        assert got["generator_predictions/dense/kernel"] == (64, 128)
        # Discriminator size by formula (embeddings + projection + 12 blocks + head).
        E, H, F, n = 128, 256, 1024, 12
        emb = (30522 + 512 + 2) * E + 2 * E
        proj = E * H + H
        block = 4 * (H * H + H) + (H * F + F) + (F * H + H) + 2 * 2 * H
        head = (H * H + H) + (H + 1)
        expected = emb + proj + n * block + head
        assert expected == 13_549_057
        n_disc = sum(int(np.prod(v.shape)) for v in modeling.discriminator_variables(model))
        n_enc = sum(int(np.prod(v.shape)) for v in model.electra.trainable_variables)
        print(f"small discriminator: {n_disc:,} parameters ({n_enc:,} without the head)")
        assert n_disc == expected and n_enc == expected - head == 13_483_008
    else:
        assert ("electra/embeddings_project/kernel" in got) == (E != H)
        assert got["generator/embeddings_project/kernel"] == (E, gh)


def test_tie_all_weights_shares_the_encoder():
    cfg = dataclasses.replace(TINY, generator_hidden_size=1.0, tie_all_weights=True)
    model = modeling.ElectraPretrainingModel(cfg)
    assert model.generator is model.electra
    gen = {id(v) for v in model.generator.trainable_variables}
    assert gen == {id(v) for v in model.electra.trainable_variables}
    names = _check_name_map(model, cfg)
    assert not any(n.startswith("generator/") for n in names)
    assert model.generator_predictions.dense.kernel.shape == (cfg.hidden_size, cfg.embedding_size)
    ids, mask, seg, pos = _inputs()
    hidden = model.discriminator_hidden(ids, mask, seg)
    np.testing.assert_allclose(model.generator_hidden(ids, mask, seg).numpy(), hidden.numpy())
    # The MLM head reads the shared encoder's states at the masked positions.
    np.testing.assert_allclose(
        model.generator_mlm_logits(ids, mask, seg, pos).numpy(),
        model.generator_predictions(tf.gather(hidden, pos, axis=1, batch_dims=1)).numpy(),
        rtol=1e-6, atol=1e-6)


def test_untied_embeddings_are_separate():
    cfg = dataclasses.replace(TINY, tie_embeddings=False)
    model = modeling.ElectraPretrainingModel(cfg)
    names = _check_name_map(model, cfg)
    assert "generator/embeddings/word_embeddings" in names
    assert model.generator.embeddings is not model.electra.embeddings
    # The generator's output matrix is its own (input/output tied within the generator).
    assert model.generator_predictions.embeddings is model.generator.embeddings
    disc = {id(v) for v in modeling.discriminator_variables(model)}
    gen = {id(v) for v in model.generator.trainable_variables +
           model.generator_predictions.trainable_variables}
    assert not disc & gen


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_two_tower_generator_sees_every_token_but_its_own(tie_embeddings):
    """ELECTRIC's cloze model: position t's representation (and its vocabulary logits)
    must not depend on the token at t, and must depend on its neighbours; the ltr tower
    alone sees only the left context."""
    cfg = dataclasses.replace(TINY, two_tower_generator=True, tie_embeddings=tie_embeddings)
    model = modeling.ElectraPretrainingModel(cfg)
    names = _check_name_map(model, cfg)
    assert "generator_ltr/encoder/layer_0/attention/self/query/kernel" in names
    assert "generator_rtl/embeddings_project/kernel" in names  # E=32 != h=16
    assert model.generator_predictions.dense.kernel.shape == (32, cfg.embedding_size)
    assert "cloze_predictions/output_bias" in names and not any(
        n.startswith(("generator/", "generator_predictions/")) for n in names)
    shared = model.generator.embeddings is model.embeddings
    assert shared == tie_embeddings
    assert ("generator_ltr/embeddings/word_embeddings" in names) != tie_embeddings
    ids, mask, seg, _ = _inputs(pad=0)
    hidden = model.generator_hidden(ids, mask, seg).numpy()
    logits = model.generator_predictions(hidden).numpy()
    ltr = model.generator.towers[0](ids, mask, seg).numpy()
    t = 6
    changed = ids.copy()
    changed[:, t] = (changed[:, t] + 1) % cfg.vocab_size
    hidden2 = model.generator_hidden(changed, mask, seg).numpy()
    np.testing.assert_array_equal(model.generator_predictions(hidden2).numpy()[:, t],
                                  logits[:, t])
    assert np.abs(hidden2[:, t - 1] - hidden[:, t - 1]).max() > 1e-3  # rtl context
    assert np.abs(hidden2[:, t + 1] - hidden[:, t + 1]).max() > 1e-3  # ltr context
    ltr2 = model.generator.towers[0](changed, mask, seg).numpy()
    np.testing.assert_array_equal(ltr2[:, :t], ltr[:, :t])
    assert np.abs(ltr2[:, t:] - ltr[:, t:]).max() > 1e-3


def test_two_tower_generator_needs_its_own_encoders():
    with pytest.raises(ValueError, match="two_tower_generator .* cannot share all weights"):
        dataclasses.replace(TINY, generator_hidden_size=1.0, tie_all_weights=True,
                            two_tower_generator=True).check()


def test_variable_groups_and_gradients(tiny):
    disc = modeling.discriminator_variables(tiny)
    gen = tiny.generator.trainable_variables + tiny.generator_predictions.trainable_variables
    shared = {id(v) for v in disc} & {id(v) for v in gen}
    assert shared == {id(v) for v in tiny.embeddings.trainable_variables}
    assert {id(v) for v in disc} | {id(v) for v in gen} == {
        id(v) for v in tiny.trainable_variables}
    ids, mask, seg, pos = _inputs()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tiny.discriminator(ids, mask, seg, training=True))
    grads = tape.gradient(loss, tiny.trainable_variables)
    disc_ids = {id(v) for v in disc}
    for v, g in zip(tiny.trainable_variables, grads):
        assert (g is not None) == (id(v) in disc_ids), v.path
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tiny.generator_mlm_logits(ids, mask, seg, pos, training=True))
    grads = tape.gradient(loss, tiny.trainable_variables)
    gen_ids = {id(v) for v in gen}
    for v, g in zip(tiny.trainable_variables, grads):
        # position/type tables and every weight reach the loss; only discriminator ones don't
        assert (g is not None) == (id(v) in gen_ids), v.path


def test_initialisation(tiny):
    c = TINY
    k = tiny.electra.blocks[0].query.kernel.numpy()
    assert np.abs(k).max() <= 2 * c.initializer_range + 1e-6
    assert abs(k.std() - 0.88 * c.initializer_range) < 0.005  # truncated at 2 sigma
    proj = tiny.electra.embeddings_project.kernel.numpy()
    limit = np.sqrt(6.0 / (c.embedding_size + c.hidden_size))
    assert np.abs(proj).max() <= limit and np.abs(proj).max() > 2 * c.initializer_range
    d1 = tiny.discriminator_predictions.dense_1.kernel.numpy()
    assert np.abs(d1).max() <= np.sqrt(6.0 / (c.hidden_size + 1))
    assert np.all(tiny.generator_predictions.output_bias.numpy() == 0)
    assert np.all(tiny.electra.blocks[0].output_layer_norm.gamma.numpy() == 1)


def _copy_weights(src, dst):
    by_path = {v.path: v for v in src.trainable_variables}
    for v in dst.trainable_variables:
        v.assign(by_path[v.path].numpy())


# Measured on CPU at initialisation (logit scale ~0.3-0.5): bf16 max diff ~0.003, fp16 ~0.0003.
@pytest.mark.parametrize("policy,tol", [("mixed_bfloat16", 0.02), ("mixed_float16", 0.003)])
def test_mixed_precision_close_to_float32(tiny, policy, tol):
    ids, mask, seg, pos = _inputs()
    previous = keras.config.dtype_policy()
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        low = modeling.ElectraPretrainingModel(TINY)
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
    compute = "bfloat16" if "bfloat16" in policy else "float16"
    assert low.electra.blocks[0].query.compute_dtype == compute
    assert all(v.dtype == "float32" for v in low.trainable_variables)
    _copy_weights(tiny, low)
    assert low.discriminator_hidden(ids, mask, seg).dtype == compute
    d32 = tiny.discriminator(ids, mask, seg).numpy()
    d16 = low.discriminator(ids, mask, seg)
    g32 = tiny.generator_mlm_logits(ids, mask, seg, pos).numpy()
    g16 = low.generator_mlm_logits(ids, mask, seg, pos)
    assert d16.dtype == tf.float32 and g16.dtype == tf.float32
    d_err = np.abs(d16.numpy() - d32).max()
    g_err = np.abs(g16.numpy() - g32).max()
    print(f"\n{policy}: max |disc logit diff| {d_err:.4f} (scale {np.abs(d32).max():.2f}), "
          f"max |MLM logit diff| {g_err:.4f} (scale {np.abs(g32).max():.2f})")
    assert d_err < tol and g_err < tol
    # The same through the dtype argument instead of the global policy.
    arg = modeling.ElectraPretrainingModel(TINY, dtype=policy)
    assert arg.generator.blocks[0].value.compute_dtype == compute
    _copy_weights(tiny, arg)
    np.testing.assert_allclose(arg.discriminator(ids, mask, seg).numpy(), d16.numpy())


def _loss_and_grad_norm(model, ids, mask, seg, pos, seed=None, training=True):
    """A train-step-like loss (MLM + discriminator logits), its squared gradient norm and
    how many variables get a gradient."""
    with tf.GradientTape() as tape:
        mlm = model.generator_mlm_logits(ids, mask, seg, pos, training=training, seed=seed)
        disc = model.discriminator(ids, mask, seg, training=training, seed=seed)
        loss = tf.reduce_mean(mlm) + tf.reduce_mean(disc)
    grads = tape.gradient(loss, model.trainable_variables)
    norm = tf.add_n([tf.reduce_sum(tf.square(tf.convert_to_tensor(g))) for g in grads])
    return loss, norm, len([g for g in grads if g is not None])


def test_blocks_on_rows_equal_blocks_on_sequences(tiny):
    """Inference outside XLA runs the blocks on [B * L, H] rows: each block gives its
    [B, L, H] form's numbers bit for bit (dropout too), and a graph of the encoder holds
    no Keras tensordot plumbing (with an unknown batch size: ~15 shape ops a Dense)."""
    ids, mask, seg, _ = _inputs()
    x = tf.constant(np.random.RandomState(3).randn(B, L, TINY.hidden_size), tf.float32)
    block = tiny.electra.blocks[0]
    seed = tf.constant([5, 6, 0])
    for training in (False, True):
        seq = block(x, mask, training=training, seed=seed).numpy()
        rows = block(tf.reshape(x, [B * L, -1]), mask, training=training, seed=seed).numpy()
        np.testing.assert_array_equal(rows.reshape(seq.shape), seq)
    spec = tf.TensorSpec([None, L], tf.int32)
    graph = tf.function(lambda i, m, s: tiny.discriminator_hidden(i, m, s)).get_concrete_function(
        spec, spec, spec).graph
    assert graph.outputs[0].shape.as_list() == [None, L, TINY.hidden_size]
    types = {op.type for op in graph.get_operations() if "/layer_" in op.name}
    assert "MatMul" in types and not types & {"Prod", "GatherV2"}  # tensordot's own ops
    np.testing.assert_allclose(tiny.discriminator_hidden(ids, mask, seg).numpy(),
                               tf.function(tiny.discriminator_hidden)(ids, mask, seg).numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.xla_cpu
def test_xla_compiled_train_like_step(tiny):
    ids, mask, seg, pos = _inputs()

    @tf.function(jit_compile=True)
    def step(ids, mask, seg, pos, seed):
        dropped = _loss_and_grad_norm(tiny, ids, mask, seg, pos, seed)[:2]
        plain = _loss_and_grad_norm(tiny, ids, mask, seg, pos, training=False)[:2]
        return (tiny.discriminator(ids, mask, seg), tiny.generator_mlm_logits(ids, mask, seg, pos),
                dropped, plain)

    disc, mlm, dropped, plain = step(ids, mask, seg, pos, tf.constant([3, 4]))
    np.testing.assert_allclose(disc.numpy(), tiny.discriminator(ids, mask, seg).numpy(),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mlm.numpy(), tiny.generator_mlm_logits(ids, mask, seg, pos).numpy(),
                               rtol=1e-4, atol=1e-4)
    # Without dropout, the compiled loss and gradients are the eager ones.
    loss, norm, n = _loss_and_grad_norm(tiny, ids, mask, seg, pos, training=False)
    assert n == len(tiny.trainable_variables)
    np.testing.assert_allclose(plain[0].numpy(), loss.numpy(), rtol=1e-4)
    np.testing.assert_allclose(plain[1].numpy(), norm.numpy(), rtol=1e-3)
    # With it, a pure function of the seed, the eager one's (the hashed draws are the same
    # numbers compiled or not): the same seed again gives the same step, another seed not.
    again = step(ids, mask, seg, pos, tf.constant([3, 4]))[2]
    other = step(ids, mask, seg, pos, tf.constant([3, 5]))[2]
    assert (again[0].numpy(), again[1].numpy()) == (dropped[0].numpy(), dropped[1].numpy())
    eager = _loss_and_grad_norm(tiny, ids, mask, seg, pos, tf.constant([3, 4]))
    np.testing.assert_allclose(dropped[0].numpy(), eager[0].numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dropped[1].numpy(), eager[1].numpy(), rtol=1e-3)
    assert abs(other[1].numpy() - dropped[1].numpy()) > 1e-3 * plain[1].numpy()
    assert abs(dropped[1].numpy() - plain[1].numpy()) > 1e-3 * plain[1].numpy()


def test_under_a_distribution_strategy(tiny):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = modeling.ElectraPretrainingModel(TINY)
    _copy_weights(tiny, model)
    ids, mask, seg, pos = _inputs()
    seed = tf.constant([5, 6], tf.int32)

    @tf.function
    def step():
        return strategy.run(lambda: _loss_and_grad_norm(model, ids, mask, seg, pos, seed))

    loss, gnorm, n = step()
    expected_loss, expected_norm, _ = _loss_and_grad_norm(tiny, ids, mask, seg, pos, seed)
    assert n == len(model.trainable_variables) == 82
    np.testing.assert_allclose(loss.numpy(), expected_loss.numpy(), rtol=1e-5)
    np.testing.assert_allclose(gnorm.numpy(), expected_norm.numpy(), rtol=1e-4)


def test_object_checkpoints_hold_each_variable_once(tiny, tmp_path):
    """(Name-based TF1 checkpoints: tests/test_checkpoints.py.)"""
    ids, mask, seg, _ = _inputs()
    # Object-based checkpoints (the training loop's) hold every variable exactly once.
    full = tf.train.Checkpoint(model=tiny).write(str(tmp_path / "obj" / "full"))
    stored = [n for n, _ in tf.train.list_variables(full) if n.endswith("VARIABLE_VALUE")]
    assert len(stored) == len(tiny.trainable_variables) == 82
    # Object-based discriminator checkpoint restores into the stand-alone encoder too.
    path = tf.train.Checkpoint(
        electra=tiny.electra, discriminator_predictions=tiny.discriminator_predictions
    ).write(str(tmp_path / "obj" / "disc"))
    other = modeling.build_discriminator_encoder(TINY)
    tf.train.Checkpoint(electra=other).read(path).expect_partial()
    np.testing.assert_array_equal(other(ids, mask, seg).numpy(),
                                  tiny.discriminator_hidden(ids, mask, seg).numpy())


@pytest.mark.parametrize("variant", [{"disentangled_embeddings": True},
                                     {"two_tower_generator": True}])
def test_object_checkpoints_hold_the_variants_weights(variant, tmp_path):
    """GDES deltas and the two towers are in the training checkpoint (exact resume),
    each once, and restore into a fresh model."""
    cfg = dataclasses.replace(TINY, **variant)
    model = modeling.ElectraPretrainingModel(cfg)
    for i, v in enumerate(model.trainable_variables):
        v.assign(tf.random.stateless_normal(v.shape, [i, 1], stddev=0.1))
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    stored = [n for n, _ in tf.train.list_variables(path) if n.endswith("VARIABLE_VALUE")]
    assert len(stored) == len(model.trainable_variables)
    fresh = modeling.ElectraPretrainingModel(cfg)
    tf.train.Checkpoint(model=fresh).read(path).assert_consumed()
    for a, b in zip(model.trainable_variables, fresh.trainable_variables):
        assert a.path == b.path
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_tf1_variables_map_names_to_variables(tiny):
    named = modeling.tf1_variables(tiny)
    assert len(named) == len(tiny.trainable_variables) == 82
    assert all(v.path == name for name, v in named.items())
    disc = modeling.tf1_variables(tiny, modeling.discriminator_variables(tiny) * 2)
    assert list(disc) == [v.path for v in modeling.discriminator_variables(tiny)]
    assert modeling.tf1_name("outer/electra/encoder/layer_0/output/dense/bias:0") == \
        "electra/encoder/layer_0/output/dense/bias"
    with pytest.raises(ValueError) as e:
        modeling.tf1_name("dense/kernel")
    assert str(e.value) == f"variable 'dense/kernel' is not under any of {modeling.TF1_ROOTS}"
    # Two models' variables under one name (e.g. a second model built beside the first).
    twin = modeling.build_discriminator_encoder(TINY).embeddings.word_embeddings
    name = "electra/embeddings/word_embeddings"
    with pytest.raises(ValueError) as e:
        modeling.tf1_variables(tiny, [tiny.electra.embeddings.word_embeddings, twin])
    assert str(e.value) == f"variables {name!r} and {name!r} both map to {name!r}"


def test_layer_norm_matvec_means_equal_reductions():
    """The CPU path (means as float32 matvecs) gives the reduction path's output."""
    from electra_tf.model import modeling
    ln = modeling.LayerNorm(64)
    ln.build()
    x = tf.constant(np.random.default_rng(0).normal(3.0, 2.0, (4, 5, 64)).astype(np.float32))
    r = tf.constant(np.random.default_rng(1).normal(0.0, 1.0, (4, 5, 64)).astype(np.float32))
    try:
        kernels.use_matvec_means(False)
        plain = ln(x, residual=r).numpy()
        kernels.use_matvec_means(True)
        matvec = ln(x, residual=r).numpy()
    finally:
        kernels.use_matvec_means(False)
    np.testing.assert_allclose(matvec, plain, atol=2e-5)
    np.testing.assert_allclose(plain.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(plain.std(-1), 1.0, atol=1e-3)


def _gelu_and_grad(x, dy, jit_compile=False):
    """gelu(x), its gradient times dy, and whether the fused path was traced."""
    used = []

    @tf.function(jit_compile=jit_compile, autograph=False)
    def run(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            used.append(tf_kernels.fused_backward())
            y = modeling.gelu(x)
        return y, tape.gradient(y, x, output_gradients=dy)
    y, dx = run(x, dy)
    return y.numpy(), dx.numpy(), used[0]


@pytest.mark.xla_cpu
def test_gelu_fused_gradient_equals_autodiff():
    """Outside XLA under a tape the gradient is one XLA kernel: the forward stays
    `tf.nn.gelu`'s bit for bit, the gradient autodiff's to rounding; in eager, in inference
    code and inside XLA the plain op runs."""
    r = np.random.default_rng(0)
    x = tf.constant(np.concatenate([r.normal(0.0, 3.0, 4000), [0.0, -0.0, 12.0, -12.0, 1e-20]])
                    .astype(np.float32))
    dy = tf.constant(r.normal(0.0, 1.0, x.shape[0]).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        ref = tf.nn.gelu(x, approximate=False)
    ref_dx = tape.gradient(ref, x, output_gradients=dy).numpy()
    y, dx, fused = _gelu_and_grad(x, dy)
    assert fused
    np.testing.assert_array_equal(y, ref.numpy())
    np.testing.assert_allclose(dx, ref_dx, rtol=2e-6, atol=1e-7)
    assert dx[-5:-3].tolist() == (0.5 * dy.numpy()[-5:-3]).tolist()  # gelu'(0) = 1/2
    assert dx[-3] == dy.numpy()[-3] and abs(dx[-2]) < 1e-29  # gelu' at 12 and -12
    _, xla_dx, fused_in_xla = _gelu_and_grad(x, dy, jit_compile=True)
    assert not fused_in_xla
    np.testing.assert_allclose(xla_dx, ref_dx, rtol=2e-6, atol=1e-7)
    assert not tf_kernels.fused_backward()  # eager
    assert not tf.function(tf_kernels.fused_backward)()  # a graph, no tape
