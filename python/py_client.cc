// SPDX-License-Identifier: Apache-2.0
#include "python/py_client.h"

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

}  // namespace

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
  VariableSpec spec{
      .name = name,
      .shape = view.shape,
      .dtype = view.dtype,
      .priority = Priority(priority.value_or(static_cast<int64_t>(variables_.size()))),
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
}

}  // namespace psched::python
