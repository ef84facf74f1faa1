// SPDX-License-Identifier: Apache-2.0
// The C++ side of the Python module psched._core: a Client that takes Python buffers (numpy
// arrays, or torch CPU tensors through their numpy view) and keeps them alive as long as the
// C++ client may touch them.
//
// Memory (zero copy): a registered array *is* the variable's parameter memory; fresh values are
// written into it by the client's threads. Its PyVariable keeps a reference to it, and the
// PyClient keeps every PyVariable, so the memory outlives the C++ Client. A pushed gradient is
// referenced until its wait() returns, or until the C++ Client is gone (close()).
//
// Threads and the GIL: every method is called with the GIL held; those that block (connect,
// register, wait, pull, close) release it while C++ blocks. The client's own threads never
// touch Python objects.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "client/client.h"

namespace psched::python {

namespace py = pybind11;

// A table's init from Python's tuple: ("zeros",), ("uniform", low, high) or ("normal", mean,
// std); throws Error(invalid_argument) showing the tuple for any other.
RowInit row_init(const py::tuple& init);

// The module's functions of psched export (python/py_export.cc): initial_rows, export_model.
void bind_export(py::module_& m);

// A registered variable as Python sees it.
struct PyVariable {
  std::string name;
  std::vector<uint64_t> shape;
  DType dtype = DType::float32;
  Priority priority;
  VariableHandle handle;
  py::object value;  // the parameter memory (the registered array)
  // Gradients of pushes not yet waited for, by step; released after their wait.
  std::map<uint64_t, py::object> in_flight;
};

// A registered embedding table as Python sees it.
struct PyTable {
  TableSpec spec;
  TableHandle handle;
  Compression compression;  // what its rows travel in (Client::table_compression)
  // The ids and gradients of pushes not yet waited for, by step; released after their wait.
  std::map<uint64_t, std::pair<py::object, py::object>> in_flight;
};

// A pull of rows under way (PyClient::start_pull_rows): keeps its ids and out arrays alive
// until it has finished.
class PyRowsPull {
 public:
  PyRowsPull(RowsPull pull, py::object ids, py::object out)
      : pull_(std::move(pull)), ids_(std::move(ids)), out_(std::move(out)) {}
  // Waits (GIL released) for a pull still writing into `out`, its error dropped.
  ~PyRowsPull();
  PyRowsPull(const PyRowsPull&) = delete;
  PyRowsPull& operator=(const PyRowsPull&) = delete;
  // Blocks (GIL released) until the rows are in `out`; raises the pull's error.
  void wait();
  bool ready() const { return pull_.ready(); }

 private:
  RowsPull pull_;
  py::object ids_, out_;
};

class PyClient {
 public:
  // Connects to every shard (GIL released). Throws psched::Error.
  explicit PyClient(ClientOptions options);
  ~PyClient();

  // Registers `value` (writable, C-contiguous float32/float64) as the variable `name`; its
  // content is the initial value. Priority defaults to the registration order; no optimizer
  // means the deployment's default; no compression, the options' (the deployment's).
  std::shared_ptr<PyVariable> register_variable(std::string name, py::buffer value,
                                                std::optional<int64_t> priority,
                                                std::optional<optim::OptimizerSpec> optimizer,
                                                std::optional<Compression> compression);
  // Starts the push of `gradient` (C-contiguous, the variable's shape and dtype) for `step`;
  // keeps a reference to it until wait(variable, step) returns. Steps come from Python as
  // plain ints and become Steps here.
  void push(PyVariable& variable, uint64_t step, py::buffer gradient);
  // Blocks (GIL released) until step's fresh value is in the variable's memory.
  void wait(PyVariable& variable, uint64_t step);
  // Whether wait(variable, step) would return at once.
  bool ready(PyVariable& variable, uint64_t step);
  // Overwrites the variable's memory with the shards' current value (GIL released).
  void pull(PyVariable& variable, uint64_t after);
  // Embedding tables (client/client.h says what each does). `dtype`: "float32" or "float64";
  // `optimizer`: a row optimizer's name, its `settings` torch.optim's keywords (betas as beta1,
  // beta2) over torch's defaults, an unknown one refused naming it; `init`: ("zeros",),
  // ("uniform", low, high) or ("normal", mean, std); `max_rows`, `admit_after`: TableSpec's
  // capacity (0: the deployment's tables: section, else none); `compression`: the table's own
  // (none: the client's default, as rows take it).
  std::shared_ptr<PyTable> register_table(std::string name, uint64_t num_embeddings, uint32_t dim,
                                          const std::string& dtype, const std::string& optimizer,
                                          std::optional<py::dict> settings, py::tuple init,
                                          uint64_t seed, std::optional<int64_t> priority,
                                          std::optional<Compression> compression, uint64_t max_rows,
                                          uint32_t admit_after);
  // `ids`: a 1-D int64 array, each id once; `gradients`: C-contiguous, ids.size() rows of the
  // table's dtype. Both are referenced until wait_rows(table, step) returns.
  void push_rows(PyTable& table, py::buffer ids, py::buffer gradients, uint64_t step);
  void wait_rows(PyTable& table, uint64_t step);
  // Writes the rows `ids` (int64, duplicates allowed) into `out` (writable, C-contiguous,
  // ids.size() rows of the table's dtype); with `after`, once that step's update of them is
  // applied (GIL released).
  void pull_rows(PyTable& table, py::buffer ids, py::buffer out, std::optional<uint64_t> after);
  // pull_rows started, returning at once; `prefetch`: Client::start_pull_rows's.
  std::shared_ptr<PyRowsPull> start_pull_rows(PyTable& table, py::buffer ids, py::buffer out,
                                              std::optional<uint64_t> after, bool prefetch);
  uint64_t start_step();
  // The variable registered under `name`; Error(unknown_variable) when there is none.
  std::shared_ptr<PyVariable> variable(const std::string& name) const;
  const std::vector<std::shared_ptr<PyVariable>>& variables() const { return variables_; }
  // The partitions finished since the last call (the newest Scheduler::kMaxRecords) as a
  // Chrome trace-event JSON document (client/chrome_trace.h), one process named `name`;
  // times are microseconds since `epoch_seconds` on the steady clock (CLOCK_MONOTONIC, what
  // Python's time.monotonic() reads), so a trainer can add its own slices on the same axis.
  std::string chrome_trace(std::string name, double epoch_seconds);
  // Disconnects (GIL released); pushes in flight are abandoned. Later calls raise.
  void close();
  bool closed() const { return client_ == nullptr; }

 private:
  // Variables and tables registered so far: the default priority of the next one, so that both
  // go in the order the model first used them.
  int64_t registered() const { return static_cast<int64_t>(variables_.size() + tables_.size()); }
  Client& client();

  std::vector<std::shared_ptr<PyVariable>> variables_;  // in registration order
  std::vector<std::shared_ptr<PyTable>> tables_;        // kept for their buffers in flight
  std::map<std::string, std::shared_ptr<PyVariable>, std::less<>> by_name_;
  std::unique_ptr<Client> client_;  // destroyed before the buffers above are released
};

}  // namespace psched::python
