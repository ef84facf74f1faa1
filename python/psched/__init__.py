# SPDX-License-Identifier: Apache-2.0
"""psched: a worker's client of a psched parameter server.

    import psched
    client = psched.connect("configs/local.yaml")           # worker id from RANK, else 0
    w = client.register("fc1/w", weights)                   # numpy array or torch CPU tensor
    for step in range(1, steps + 1):
        ...                                                 # compute grad
        client.push(w, step, grad)                          # returns at once
        client.wait(w, step)                                # fresh values are now in weights

A registered array *is* the variable's memory (zero copy): the client writes fresh values into
it, and keeps it alive as long as the client. A pushed gradient must stay unchanged until its
wait() returns; the client keeps a reference to it until then. wait() and pull() release the
GIL. Failures raise psched.Error (with `.code`, e.g. "shape_mismatch") or its subclasses
DisconnectedError, OverloadedError, UnimplementedError; the message is the server's.

For PyTorch models, psched.torch.DistributedModel does all of this from hooks.
"""
import os

from . import _core
from ._core import ClientOptions, Compression, Deployment, Optimizer, Variable, load_deployment
from .errors import DisconnectedError, Error, OverloadedError, UnimplementedError

__all__ = ["Client", "ClientOptions", "Compression", "Deployment", "DisconnectedError", "Error",
           "Optimizer",
           "OverloadedError", "UnimplementedError", "Variable", "connect", "load_deployment",
           "worker_from_env"]


def _as_buffer(array):
    """A buffer over `array`'s memory: numpy arrays as they are, torch CPU tensors through
    their numpy view (same memory; the view keeps the tensor alive)."""
    numpy_view = getattr(array, "numpy", None)
    if numpy_view is None or not hasattr(array, "device"):
        return array
    if array.device.type != "cpu":
        raise Error(f"psched needs CPU tensors; this one is on {array.device}",
                    "invalid_argument")
    return array.detach().numpy()


class Client(_core.Client):
    """A worker's connection to every shard. Variables may be named by their Variable or by
    the name they were registered under."""

    def __init__(self, options, deployment=None):
        super().__init__(options)
        self.deployment = deployment  # the Deployment it came from, if any
        self.worker = options.worker

    def register(self, name, value, *, priority=None, optimizer=None, compression=None):
        """Registers `value` (a writable, C-contiguous float32/float64 array or CPU tensor) as
        the variable `name`. Its content is the initial value; the first registration of a name
        wins, so call pull() to adopt the shards' value. Priority: lower goes first; default:
        registration order (of variables and tables together). Optimizer: a psched.Optimizer;
        default: the deployment's. Compression: a psched.Compression; default: the
        deployment's compression: section."""
        return super().register(name, _as_buffer(value), priority=priority, optimizer=optimizer,
                                compression=compression)

    def push(self, variable, step, gradient):
        """Starts pushing the whole gradient of `variable` for `step` (1, 2, ...)."""
        super().push(self._variable(variable), step, _as_buffer(gradient))

    def wait(self, variable, step):
        """Blocks until `step`'s fresh value is in the variable's memory; raises the push's
        error."""
        super().wait(self._variable(variable), step)

    def ready(self, variable, step):
        """Whether wait(variable, step) would return at once (a non-blocking poll)."""
        return super().ready(self._variable(variable), step)

    def pull(self, variable, after=0):
        """Overwrites the variable's memory with the shards' current value; with `after`,
        once step `after`'s update is applied (sync: the job's step; async: this worker's)."""
        super().pull(self._variable(variable), after)


    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _variable(self, variable):
        return self.variable(variable) if isinstance(variable, str) else variable


def worker_from_env(default=0):
    """The worker id torchrun gives this process (RANK), or `default`."""
    return int(os.environ.get("RANK", default))


def connect(config=None, worker=None, *, shards=None, token="", policy=None,
            partition_bytes=None, credit_bytes=None, join=True):
    """Connects to a deployment.

    config: a deployment YAML file (default: $PSCHED_CONFIG); or give `shards` ("host:port"
    list) and `token` instead. worker: this worker's id (default: $RANK as torchrun sets it,
    else 0); with a config, $WORLD_SIZE (when set) must equal its `workers`. policy,
    partition_bytes, credit_bytes override the scheduler settings. join: this is a trainer
    that takes part from Client.start_step; False for a client that only reads.
    """
    worker = worker_from_env() if worker is None else worker
    config = config if config is not None or shards else os.environ.get("PSCHED_CONFIG")
    deployment = None
    if config is not None:
        deployment = load_deployment(os.fspath(config))
        world_size = os.environ.get("WORLD_SIZE")
        if world_size is not None and int(world_size) != deployment.workers:
            raise Error(f"WORLD_SIZE={world_size} but {deployment.path} has workers: "
                        f"{deployment.workers}", "bad_config")
        options = ClientOptions.from_config(deployment, worker)
    elif shards:
        options = ClientOptions()
        options.shards = list(shards)
        options.token = token
        options.worker = worker
    else:
        raise Error("connect() needs a deployment file (or $PSCHED_CONFIG) or a list of shards",
                    "bad_config")
    options.join = join
    for key, value in (("policy", policy), ("partition_bytes", partition_bytes),
                       ("credit_bytes", credit_bytes)):
        if value is not None:
            setattr(options, key, value)
    return Client(options, deployment)
