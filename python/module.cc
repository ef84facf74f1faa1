// SPDX-License-Identifier: Apache-2.0
// psched._core: the pybind11 binding of the C++ client. The package psched (psched/__init__.py)
// re-exports it with the conveniences (configs from torchrun's environment, torch tensors);
// read that file for the user-facing API.
//
// Errors: psched::Error becomes psched.Error (or its subclass for the error's category) with
// the C++ message and `.code`, the ErrorCode's name ("shape_mismatch", "disconnected", ...).
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include "common/error.h"
#include "compression/codec.h"
#include "config/deployment.h"
#include "python/py_client.h"

namespace psched::python {
namespace {

// The classes of psched/errors.py, one per ErrorCategory. sys.modules keeps them alive.
struct ErrorTypes {
  py::handle error, disconnected, overloaded, unimplemented;

  py::handle of(ErrorCode code) const {
    switch (category(code)) {
      case ErrorCategory::disconnected:
        return disconnected;
      case ErrorCategory::overloaded:
        return overloaded;
      case ErrorCategory::unimplemented:
        return unimplemented;
      default:
        return error;
    }
  }
};

// psched::Error -> psched.errors.<class>(message, code).
void translate_errors() {
  static ErrorTypes types;
  py::module_ errors = py::module_::import("psched.errors");
  types = {errors.attr("Error"), errors.attr("DisconnectedError"), errors.attr("OverloadedError"),
           errors.attr("UnimplementedError")};
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      py::handle type = types.of(e.code());
      PyErr_SetObject(type.ptr(), type(e.what(), to_string(e.code())).ptr());
    }
  });
}

optim::OptimizerKind optimizer_kind(const std::string& kind) {
  optim::OptimizerKind result{};
  if (!optim::parse_optimizer_kind(kind, result))
    fail(ErrorCode::invalid_argument,
         "optimizer '{}' is unknown (expected sgd, momentum, adam, adam_tf, adamw, adagrad or "
         "rmsprop)",
         kind);
  return result;
}

// The hyper-parameter names an Optimizer takes, for messages.
std::string hyperparameter_names() {
  std::vector<std::string_view> names;
  optim::for_each_hyperparameter([&](std::string_view name, auto) { names.push_back(name); });
  return fmt::format("{}", fmt::join(names, ", "));
}

// `settings` (keyword arguments named as OptimizerSpec's fields) over torch.optim's defaults
// for `kind`; sgd and momentum require lr, as torch.optim.SGD does.
optim::OptimizerSpec optimizer_from(const std::string& kind, const py::kwargs& settings) {
  optim::OptimizerSpec spec = optim::torch_defaults(optimizer_kind(kind));
  if ((spec.kind == optim::OptimizerKind::sgd || spec.kind == optim::OptimizerKind::momentum) &&
      !settings.contains("lr"))
    fail(ErrorCode::invalid_argument,
         "Optimizer('{}') needs lr: torch.optim.SGD has no default learning rate", kind);
  for (auto setting : settings) {
    std::string name = py::cast<std::string>(setting.first);
    py::handle value = setting.second;  // not a structured binding: clang 14 cannot capture one
    bool known = false;
    optim::for_each_hyperparameter([&](std::string_view field, auto member) {
      if (field != name) return;
      known = true;
      using Value = std::remove_reference_t<decltype(spec.*member)>;
      if (std::is_same_v<Value, bool> && !py::isinstance<py::bool_>(value))
        throw py::type_error(fmt::format("Optimizer(): {} takes True or False, not {}", name,
                                         py::str(value).cast<std::string>()));
      spec.*member = value.template cast<Value>();
    });
    if (!known)
      throw py::type_error(
          fmt::format("Optimizer() got an unexpected keyword argument '{}' "
                      "(expected one of: {})",
                      name, hyperparameter_names()));
  }
  optim::validate(spec);
  return spec;
}

void bind_optimizer(py::module_& m) {
  using optim::OptimizerSpec;
  auto optimizer = py::class_<OptimizerSpec>(
      m, "Optimizer",
      fmt::format("Optimizer(kind, **settings): optimizer settings for a variable; the formulas "
                  "are torch.optim's (adam_tf: TensorFlow's ApplyAdam). Settings, each with "
                  "torch.optim's default for the kind when left out (sgd and momentum require "
                  "lr, as torch.optim.SGD does; adam_tf's lr is TensorFlow's 1e-3): {}.",
                  hyperparameter_names())
          .c_str());
  optimizer.def(py::init(&optimizer_from), py::arg("kind"))
      .def_property_readonly("kind",
                             [](const OptimizerSpec& s) { return std::string(to_string(s.kind)); })
      .def("__repr__", [](const OptimizerSpec& s) {
        return fmt::format("psched.Optimizer('{}', lr={})", to_string(s.kind), s.lr);
      });
  optim::for_each_hyperparameter([&](std::string_view name, auto member) {
    optimizer.def_readonly(std::string(name).c_str(), member);
  });
}

void bind_deployment(py::module_& m) {
  py::class_<DeploymentConfig>(m, "Deployment", "A deployment file, loaded and validated.")
      .def_property_readonly("path", [](const DeploymentConfig& c) { return c.source.string(); })
      .def_property_readonly("mode", [](const DeploymentConfig& c) { return to_string(c.mode); })
      .def_readonly("workers", &DeploymentConfig::workers)
      .def_readonly("optimizer", &DeploymentConfig::optimizer,
                    "The default optimizer (`optimizer:`), a psched.Optimizer: what the shards "
                    "run for a variable registered without one, each setting the file leaves "
                    "out at torch.optim's default for the kind")
      .def_property_readonly("shards", [](const DeploymentConfig& c) {
        std::vector<std::string> shards;
        for (const ShardConfig& s : c.shards) shards.push_back(s.listen.to_string());
        return shards;
      });
  m.def("load_deployment", &load_deployment, py::arg("path"),
        "Loads a deployment YAML file; raises psched.Error (code 'bad_config') naming the line.");
}

// The format `name`, one that `fits` (a `what` format: push, pull, value).
WireFormat wire_format(const std::string& name, bool (*fits)(WireFormat), std::string_view what) {
  WireFormat format;
  if (!parse_wire_format(name, format) || !fits(format)) {
    std::vector<std::string_view> names;
    for (WireFormat f : kWireFormats)
      if (fits(f)) names.push_back(to_string(f));
    fail(ErrorCode::invalid_argument, "'{}' is not a {} format (one of: {})", name, what,
         fmt::join(names, ", "));
  }
  return format;
}

// Compression's settings, as Python names them.
Compression make_compression(const std::string& push, const std::string& pull, double topk_fraction,
                             uint64_t topk_count, uint64_t min_bytes, uint64_t warmup_steps,
                             double pull_fraction, uint32_t ring, uint64_t refresh_steps,
                             const std::string& pull_full) {
  if (ring > UINT16_MAX)
    fail(ErrorCode::invalid_argument, "compression: ring {} is over {}", ring, UINT16_MAX);
  Compression out{.push = wire_format(push, carries_pushes, "push"),
                  .pull = wire_format(pull, carries_pulls, "pull"),
                  .topk = {.fraction = topk_fraction, .count = topk_count},
                  .min_bytes = min_bytes,
                  .warmup_steps = warmup_steps,
                  .pull_fraction = pull_fraction,
                  .ring = static_cast<uint16_t>(ring),
                  .refresh_steps = refresh_steps,
                  .pull_full = wire_format(pull_full, carries_values, "value")};
  check(out);
  return out;
}

void bind_compression(py::module_& m) {
  py::class_<Compression>(m, "Compression",
                          "How a variable's gradients (push) and fresh values (pull) travel; "
                          "the deployment's compression: section is the default "
                          "(compression/wire_format.h).")
      .def(py::init(&make_compression), py::kw_only(), py::arg("push") = "none",
           py::arg("pull") = "none", py::arg("topk_fraction") = TopK{}.fraction,
           py::arg("topk_count") = 0, py::arg("min_bytes") = Compression{}.min_bytes,
           py::arg("warmup_steps") = 0, py::arg("pull_fraction") = Compression{}.pull_fraction,
           py::arg("ring") = Compression{}.ring, py::arg("refresh_steps") = 0,
           py::arg("pull_full") = "none")
      .def_property_readonly("push",
                             [](const Compression& c) { return std::string(to_string(c.push)); })
      .def_property_readonly("pull",
                             [](const Compression& c) { return std::string(to_string(c.pull)); })
      .def_property_readonly("topk_fraction", [](const Compression& c) { return c.topk.fraction; })
      .def_property_readonly("topk_count", [](const Compression& c) { return c.topk.count; })
      .def_readonly("min_bytes", &Compression::min_bytes)
      .def_readonly("warmup_steps", &Compression::warmup_steps)
      .def_readonly("pull_fraction", &Compression::pull_fraction)
      .def_readonly("ring", &Compression::ring)
      .def_readonly("refresh_steps", &Compression::refresh_steps)
      .def_property_readonly(
          "pull_full", [](const Compression& c) { return std::string(to_string(c.pull_full)); })
      .def("for_rows", &Compression::for_rows,
           "What an embedding table's rows take of this setting when it is given for every "
           "variable (DistributedModel's compression=, the deployment's): a topk or onebit push "
           "goes whole (none), a topk pull asks for full values in pull_full; min_bytes and "
           "warmup_steps stay (docs/compression.md, \"Tables\").")
      .def("__repr__", [](const Compression& c) {
        return fmt::format(
            "psched.Compression(push='{}', pull='{}', topk_fraction={}, topk_count={}, "
            "min_bytes={}, warmup_steps={}, pull_fraction={}, ring={}, refresh_steps={}, "
            "pull_full='{}')",
            to_string(c.push), to_string(c.pull), c.topk.fraction, c.topk.count, c.min_bytes,
            c.warmup_steps, c.pull_fraction, c.ring, c.refresh_steps, to_string(c.pull_full));
      });
}

void bind_client_options(py::module_& m) {
  py::class_<ClientOptions>(m, "ClientOptions", "Where and how a Client connects.")
      .def(py::init<>())
      .def_static(
          "from_config",
          [](const DeploymentConfig& c, uint32_t worker) {
            return ClientOptions::from_config(c, WorkerId(worker));
          },
          py::arg("deployment"), py::arg("worker"))
      .def_readwrite("shards", &ClientOptions::shards)
      .def_readwrite("token", &ClientOptions::token)
      .def_readwrite("max_message_bytes", &ClientOptions::max_message_bytes)
      .def_readwrite("join", &ClientOptions::join,
                     "ask the shards for start_step (a trainer); False for a client that only "
                     "reads")
      .def_readwrite("compression", &ClientOptions::compression,
                     "every variable's default psched.Compression")
      .def_property(
          "deployment_file", [](const ClientOptions& o) { return o.deployment_file.string(); },
          [](ClientOptions& o, const std::string& f) { o.deployment_file = f; },
          "the deployment file a reconnecting link reads shard addresses from again (a shard "
          "restarted elsewhere); '' never")
      .def_property(
          "worker", [](const ClientOptions& o) { return o.worker.value; },
          [](ClientOptions& o, uint32_t w) { o.worker = WorkerId(w); })
      .def_property(
          "partition_bytes", [](const ClientOptions& o) { return o.scheduler.partition_bytes; },
          [](ClientOptions& o, uint64_t b) { o.scheduler.partition_bytes = b; })
      .def_property(
          "credit_bytes", [](const ClientOptions& o) { return o.scheduler.credit_bytes; },
          [](ClientOptions& o, uint64_t b) { o.scheduler.credit_bytes = b; })
      .def_property(
          "policy",
          [](const ClientOptions& o) {
            return o.scheduler.policy == SchedulePolicy::fifo ? "fifo" : "priority";
          },
          [](ClientOptions& o, const std::string& policy) {
            if (policy != "fifo" && policy != "priority")
              fail(ErrorCode::invalid_argument, "policy '{}' is not 'priority' or 'fifo'", policy);
            o.scheduler.policy = policy == "fifo" ? SchedulePolicy::fifo : SchedulePolicy::priority;
          });
}

void bind_client(py::module_& m) {
  py::class_<PyVariable, std::shared_ptr<PyVariable>>(m, "Variable",
                                                      "A registered variable (from register).")
      .def_readonly("name", &PyVariable::name)
      .def_property_readonly("shape",
                             [](const PyVariable& v) {
                               py::tuple shape(v.shape.size());
                               for (size_t i = 0; i < v.shape.size(); ++i) shape[i] = v.shape[i];
                               return shape;
                             })
      .def_property_readonly("dtype",
                             [](const PyVariable& v) { return std::string(to_string(v.dtype)); })
      .def_property_readonly("priority", [](const PyVariable& v) { return v.priority.value; })
      .def_readonly("value", &PyVariable::value, "The registered array (parameter memory).")
      .def("__repr__", [](const PyVariable& v) {
        return fmt::format("psched.Variable('{}', shape=({}), dtype={})", v.name,
                           fmt::join(v.shape, ", "), to_string(v.dtype));
      });

  py::class_<PyTable, std::shared_ptr<PyTable>>(m, "Table",
                                                "A registered embedding table (register_table).")
      .def_property_readonly("name", [](const PyTable& t) { return t.spec.name; })
      .def_property_readonly("num_embeddings",
                             [](const PyTable& t) { return t.spec.num_embeddings; })
      .def_property_readonly("dim", [](const PyTable& t) { return t.spec.dim; })
      .def_property_readonly("priority", [](const PyTable& t) { return t.spec.priority.value; })
      .def_property_readonly("dtype",
                             [](const PyTable& t) { return std::string(to_string(t.spec.dtype)); })
      .def_readonly("compression", &PyTable::compression,
                    "The psched.Compression its rows travel in: register_table's compression=, "
                    "else the client's default as rows take it (Compression.for_rows)")
      .def("__repr__", [](const PyTable& t) {
        return fmt::format("psched.Table('{}', {} x {}, dtype={}, optimizer={})", t.spec.name,
                           t.spec.num_embeddings, t.spec.dim, to_string(t.spec.dtype),
                           optim::to_string(t.spec.optimizer.kind));
      });

  py::class_<PyRowsPull, std::shared_ptr<PyRowsPull>>(
      m, "RowsPull", "A pull of rows under way (Client.start_pull_rows); it keeps its arrays.")
      .def("wait", &PyRowsPull::wait, "Blocks until the rows are in `out`; raises its error.")
      .def("ready", &PyRowsPull::ready, "Whether wait() would return at once.");

  py::class_<PyClient>(m, "Client", "A worker's connection to every shard (client/client.h).")
      .def(py::init<ClientOptions>(), py::arg("options"))
      .def("register", &PyClient::register_variable, py::arg("name"), py::arg("value"),
           py::kw_only(), py::arg("priority") = py::none(), py::arg("optimizer") = py::none(),
           py::arg("compression") = py::none())
      .def("push", &PyClient::push, py::arg("variable"), py::arg("step"), py::arg("gradient"))
      .def("wait", &PyClient::wait, py::arg("variable"), py::arg("step"))
      .def("ready", &PyClient::ready, py::arg("variable"), py::arg("step"))
      .def("pull", &PyClient::pull, py::arg("variable"), py::arg("after") = 0)
      .def("register_table", &PyClient::register_table, py::arg("name"), py::arg("num_embeddings"),
           py::arg("dim"), py::kw_only(), py::arg("dtype") = "float32",
           py::arg("optimizer") = "sgd", py::arg("settings") = py::none(),
           py::arg("init") = py::make_tuple("zeros"), py::arg("seed") = 0,
           py::arg("priority") = py::none(), py::arg("compression") = py::none(),
           py::arg("max_rows") = 0, py::arg("admit_after") = 0)
      .def("push_rows", &PyClient::push_rows, py::arg("table"), py::arg("ids"),
           py::arg("gradients"), py::arg("step"))
      .def("wait_rows", &PyClient::wait_rows, py::arg("table"), py::arg("step"))
      .def("pull_rows", &PyClient::pull_rows, py::arg("table"), py::arg("ids"), py::arg("out"),
           py::arg("after") = py::none())
      .def("start_pull_rows", &PyClient::start_pull_rows, py::arg("table"), py::arg("ids"),
           py::arg("out"), py::kw_only(), py::arg("after") = py::none(),
           py::arg("prefetch") = false,
           "pull_rows started: returns a RowsPull at once; prefetch: scheduled below every "
           "push and pull that is not a prefetch (the rows of a step still to come)")
      .def_property_readonly("start_step", &PyClient::start_step,
                             "The first step this worker pushes: 1 in a fresh job, the step the "
                             "shards agreed on when it joins a job under way (a restarted "
                             "worker); it starts from the values pull(variable, start_step - 1) "
                             "gives")
      .def("variable", &PyClient::variable, py::arg("name"))
      .def_property_readonly("variables", &PyClient::variables)
      .def("chrome_trace", &PyClient::chrome_trace, py::arg("name"), py::arg("epoch"),
           "The partitions finished since the last call as Chrome trace-event JSON text, "
           "times in microseconds since `epoch` (seconds of time.monotonic())")
      .def("close", &PyClient::close)
      .def_property_readonly("closed", &PyClient::closed);
}

}  // namespace
}  // namespace psched::python

PYBIND11_MODULE(_core, m) {
  using namespace psched::python;
  m.doc() = "psched's C++ client; use the package psched, which re-exports it.";
  translate_errors();
  bind_optimizer(m);
  bind_compression(m);
  bind_deployment(m);
  bind_client_options(m);
  bind_client(m);
  bind_export(m);
}
