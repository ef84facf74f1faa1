// SPDX-License-Identifier: Apache-2.0
#include "python/py_client.h"

#include <algorithm>
#include <chrono>

#include <fmt/ranges.h>

#include "client/chrome_trace.h"
#include "common/error.h"

namespace psched::python {
namespace {

// A Python buffer's memory seen as a dense tensor.
struct TensorView {
  std::byte* data = nullptr;
  uint64_t bytes = 0;
  DType dtype = DType::float32;
  std::vector<uint64_t> shape;
};

// Reads the struct-module format of a native-endian float or double ("f", "<d", "=f", ...).
DType dtype_of(const py::buffer_info& info, std::string_view what) {
  std::string_view format = info.format;
  if (!format.empty() && std::string_view("@=<").find(format[0]) != std::string_view::npos)
    format.remove_prefix(1);
  if (format == "f" && info.itemsize == 4) return DType::float32;
  if (format == "d" && info.itemsize == 8) return DType::float64;
  fail(ErrorCode::dtype_mismatch, "{}: element format '{}' ({} bytes) is not float32 or float64",
       what, info.format, info.itemsize);
}

// Checks that `info` is C-contiguous (row-major, no gaps) and returns its shape.
std::vector<uint64_t> dense_shape(const py::buffer_info& info, std::string_view what) {
  std::vector<uint64_t> shape(info.shape.begin(), info.shape.end());
  py::ssize_t expected_stride = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected_stride)
      fail(ErrorCode::invalid_argument,
           "{}: the array is not C-contiguous (strides {}); pass a contiguous copy", what,
           fmt::join(info.strides, ", "));
    expected_stride *= info.shape[d];
  }
  return shape;
}

TensorView view_of(const py::buffer& buffer, bool writable, std::string_view what) {
  py::buffer_info info = buffer.request(writable);
  TensorView view;
  view.dtype = dtype_of(info, what);
  view.shape = dense_shape(info, what);
  view.data = static_cast<std::byte*>(info.ptr);
  view.bytes = static_cast<uint64_t>(info.size) * info.itemsize;
  return view;
}

// The ids in `buffer` (a 1-D int64 array) as unsigned ids, borrowed from it; a negative one is
// refused naming the table and the id.
std::span<const uint64_t> ids_of(const py::buffer& buffer, const TableSpec& table,
                                 std::string_view what) {
  py::buffer_info info = buffer.request();
  std::string_view format = info.format;
  if (!format.empty() && std::string_view("@=<").find(format[0]) != std::string_view::npos)
    format.remove_prefix(1);
  if (info.itemsize != 8 || (format != "l" && format != "q") || info.ndim != 1 ||
      (info.shape[0] > 1 && info.strides[0] != 8))
    fail(ErrorCode::invalid_argument,
         "{} of table '{}' rejected: ids must be a contiguous 1-D int64 array (got format '{}', "
         "{} dimensions)",
         what, table.name, info.format, info.ndim);
  std::span<const int64_t> ids(static_cast<const int64_t*>(info.ptr), info.shape[0]);
  for (int64_t id : ids)
    if (id < 0)
      fail(ErrorCode::offset_out_of_range, "{} of table '{}' rejected: id {} is negative", what,
           table.name, id);
  return {reinterpret_cast<const uint64_t*>(ids.data()), ids.size()};
}

// Rows of `table` in `buffer`, checked to be `rows` rows of its dtype.
TensorView rows_of(const py::buffer& buffer, bool writable, const TableSpec& table, uint64_t rows,
                   std::string_view what) {
  TensorView view = view_of(buffer, writable, what);
  if (view.dtype != table.dtype)
    fail(ErrorCode::dtype_mismatch, "{}: rows of {}, the table's are {}", what,
         to_string(view.dtype), to_string(table.dtype));
  if (view.bytes != rows * table.row_bytes())
    fail(ErrorCode::shape_mismatch, "{}: shape ({}) holds no {} rows of {}", what,
         fmt::join(view.shape, ", "), rows, table.dim);
  return view;
}

optim::RowOptimizerSpec row_optimizer(const std::string& name,
                                      const std::optional<py::dict>& given) {
  optim::RowOptimizerKind kind;
  if (!optim::parse_row_optimizer_kind(name, kind))
    fail(ErrorCode::invalid_argument,
         "unknown row optimizer '{}' (sgd, adagrad, rowwise_adagrad or sparse_adam)", name);
  optim::RowOptimizerSpec spec = optim::torch_row_defaults(kind);
  if (!given) return spec;
  const std::pair<const char*, double*> fields[] = {
      {"lr", &spec.lr},
      {"eps", &spec.eps},
      {"beta1", &spec.beta1},
      {"beta2", &spec.beta2},
      {"lr_decay", &spec.lr_decay},
      {"initial_accumulator_value", &spec.initial_accumulator_value},
      {"weight_decay", &spec.weight_decay},
      {"momentum", &spec.momentum}};
  for (auto [key, value] : *given) {
    const std::string setting = py::str(key);
    auto* field = std::find_if(std::begin(fields), std::end(fields),
                               [&](const auto& f) { return setting == f.first; });
    if (field == std::end(fields))
      fail(ErrorCode::invalid_argument, "row optimizer '{}': unknown setting '{}'", name, setting);
    *field->second = value.cast<double>();
  }
  return spec;
}

}  // namespace

RowInit row_init(const py::tuple& init) {
  const std::string kind = init.empty() ? "" : py::str(init[0]).cast<std::string>();
  RowInit out;
  if (parse_row_init_kind(kind, out.kind)) {
    if (out.kind == RowInit::Kind::zeros && init.size() == 1) return out;
    if (out.kind != RowInit::Kind::zeros && init.size() == 3)
      return {out.kind, init[1].cast<double>(), init[2].cast<double>()};
  }
  fail(ErrorCode::invalid_argument,
       "init {} is none of ('zeros',), ('uniform', low, high), ('normal', mean, std)",
       py::repr(init).cast<std::string>());
}

PyClient::PyClient(ClientOptions options) {
  py::gil_scoped_release unlocked;
  client_ = std::make_unique<Client>(std::move(options));
}

PyClient::~PyClient() {
  client_.reset();  // its threads stop before the buffers they may read are released
}

Client& PyClient::client() {
  if (!client_) fail(ErrorCode::disconnected, "the psched client is closed");
  return *client_;
}

std::shared_ptr<PyVariable> PyClient::register_variable(
    std::string name, py::buffer value, std::optional<int64_t> priority,
    std::optional<optim::OptimizerSpec> optimizer, std::optional<Compression> compression) {
  if (by_name_.contains(name))
    fail(ErrorCode::invalid_argument, "variable '{}' is already registered by this client", name);
  TensorView view = view_of(value, true, fmt::format("register '{}'", name));
  VariableSpec spec{.name = name,
                    .shape = view.shape,
                    .dtype = view.dtype,
                    .priority = Priority(priority.value_or(registered())),
                    .optimizer = optimizer.value_or(optim::OptimizerSpec{})};
  Client& c = client();
  VariableHandle handle;
  {
    py::gil_scoped_release unlocked;
    handle =
        c.register_variable(spec, {view.data, view.bytes}, !optimizer.has_value(), compression);
  }
  auto variable = std::make_shared<PyVariable>(PyVariable{.name = std::move(name),
                                                          .shape = view.shape,
                                                          .dtype = view.dtype,
                                                          .priority = spec.priority,
                                                          .handle = handle,
                                                          .value = value,
                                                          .in_flight = {}});
  variables_.push_back(variable);
  by_name_.emplace(variable->name, variable);
  return variable;
}

void PyClient::push(PyVariable& variable, uint64_t step, py::buffer gradient) {
  std::string what = fmt::format("push to variable '{}' step {}", variable.name, step);
  TensorView view = view_of(gradient, false, what);
  if (view.dtype != variable.dtype)
    fail(ErrorCode::dtype_mismatch, "{}: gradient is {}, the variable is {}", what,
         to_string(view.dtype), to_string(variable.dtype));
  if (view.shape != variable.shape)
    fail(ErrorCode::shape_mismatch, "{}: gradient shape ({}) differs from the variable's ({})",
         what, fmt::join(view.shape, ", "), fmt::join(variable.shape, ", "));
  client().push(variable.handle, Step(step), {view.data, view.bytes});
  variable.in_flight[step] = gradient;
}

void PyClient::wait(PyVariable& variable, uint64_t step) {
  Client& c = client();
  try {
    py::gil_scoped_release unlocked;
    c.wait(variable.handle, Step(step));
  } catch (...) {
    variable.in_flight.erase(step);
    throw;
  }
  variable.in_flight.erase(step);
}

bool PyClient::ready(PyVariable& variable, uint64_t step) {
  return client().ready(variable.handle, Step(step));
}

void PyClient::pull(PyVariable& variable, uint64_t after) {
  Client& c = client();
  py::gil_scoped_release unlocked;
  c.pull(variable.handle, Step(after));
}

std::shared_ptr<PyTable> PyClient::register_table(std::string name, uint64_t num_embeddings,
                                                  uint32_t dim, const std::string& dtype,
                                                  const std::string& optimizer,
                                                  std::optional<py::dict> settings, py::tuple init,
                                                  uint64_t seed, std::optional<int64_t> priority,
                                                  std::optional<Compression> compression,
                                                  uint64_t max_rows, uint32_t admit_after) {
  TableSpec spec{.name = std::move(name), .num_embeddings = num_embeddings, .dim = dim};
  if (dtype != "float32" && dtype != "float64")
    fail(ErrorCode::dtype_mismatch, "table '{}': dtype '{}' (float32 or float64)", spec.name,
         dtype);
  spec.dtype = dtype == "float32" ? DType::float32 : DType::float64;
  spec.priority = Priority(priority.value_or(registered()));
  spec.optimizer = row_optimizer(optimizer, settings);
  spec.init = row_init(init);
  spec.seed = seed;
  spec.max_rows = max_rows;
  spec.admit_after = admit_after;
  Client& c = client();
  TableHandle handle;
  {
    py::gil_scoped_release unlocked;
    handle = c.register_table(spec, compression);
  }
  auto table =
      std::make_shared<PyTable>(PyTable{std::move(spec), handle, c.table_compression(handle), {}});
  tables_.push_back(table);
  return table;
}

void PyClient::push_rows(PyTable& table, py::buffer ids, py::buffer gradients, uint64_t step) {
  const std::string what = fmt::format("push of table '{}' step {}", table.spec.name, step);
  std::span<const uint64_t> id_view = ids_of(ids, table.spec, "push");
  TensorView rows = rows_of(gradients, false, table.spec, id_view.size(), what);
  client().push_rows(table.handle, Step(step), id_view, {rows.data, rows.bytes});
  table.in_flight[step] = {ids, gradients};
}

void PyClient::wait_rows(PyTable& table, uint64_t step) {
  Client& c = client();
  try {
    py::gil_scoped_release unlocked;
    c.wait_rows(table.handle, Step(step));
  } catch (...) {
    table.in_flight.erase(step);
    throw;
  }
  table.in_flight.erase(step);
}

void PyClient::pull_rows(PyTable& table, py::buffer ids, py::buffer out,
                         std::optional<uint64_t> after) {
  start_pull_rows(table, std::move(ids), std::move(out), after, false)->wait();
}

std::shared_ptr<PyRowsPull> PyClient::start_pull_rows(PyTable& table, py::buffer ids,
                                                      py::buffer out, std::optional<uint64_t> after,
                                                      bool prefetch) {
  std::span<const uint64_t> id_view = ids_of(ids, table.spec, "pull");
  TensorView rows = rows_of(out, true, table.spec, id_view.size(),
                            fmt::format("pull of table '{}'", table.spec.name));
  RowsPull pull = client().start_pull_rows(table.handle, id_view, {rows.data, rows.bytes},
                                           Step(after.value_or(0)), prefetch);
  return std::make_shared<PyRowsPull>(std::move(pull), std::move(ids), std::move(out));
}

PyRowsPull::~PyRowsPull() {
  if (pull_.ready()) return;
  py::gil_scoped_release unlocked;
  try {
    pull_.wait();
  } catch (...) {  // nobody asked for its outcome
  }
}

void PyRowsPull::wait() {
  py::gil_scoped_release unlocked;
  pull_.wait();
}

uint64_t PyClient::start_step() {
  return client().start_step().value;
}

std::shared_ptr<PyVariable> PyClient::variable(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    fail(ErrorCode::unknown_variable, "no variable '{}' is registered by this client", name);
  return it->second;
}

std::string PyClient::chrome_trace(std::string name, double epoch_seconds) {
  Client& c = client();
  std::vector<TaskRecord> records;
  {
    py::gil_scoped_release unlocked;
    records = c.take_records();
  }
  auto epoch = std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(epoch_seconds)));
  return psched::chrome_trace({{std::move(name), std::move(records), epoch}}).dump();
}

void PyClient::close() {
  {
    py::gil_scoped_release unlocked;
    client_.reset();
  }
  for (auto& variable : variables_) variable->in_flight.clear();
  for (auto& table : tables_) table->in_flight.clear();
}

}  // namespace psched::python
