// SPDX-License-Identifier: Apache-2.0
// psched._core's functions for a model leaving psched (issue 56; python/psched/export.py uses
// them): a table's initial rows computed by the shards' own function, and `psched export` run
// from Python.
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include "actors/shard/model_export.h"
#include "actors/shard/row_init.h"
#include "actors/shard/row_table.h"
#include "common/error.h"
#include "python/py_client.h"

namespace psched::python {
namespace {

DType dtype_named(const std::string& name) {
  if (name == "float32") return DType::float32;
  if (name == "float64") return DType::float64;
  fail(ErrorCode::invalid_argument, "dtype '{}' is neither float32 nor float64", name);
}

// The initial rows of `ids` (a 1-D integer array) in a table of `dim`, `dtype`, `init` and
// `seed`: a new (len(ids), dim) array, row k the shards' initial value of ids[k].
template <typename T>
py::array_t<T> initial_rows_of(const TableSpec& spec, const py::array_t<uint64_t>& ids) {
  const auto n = static_cast<size_t>(ids.size());
  py::array_t<T> out({n, static_cast<size_t>(spec.dim)});
  const uint64_t* id = ids.data();
  auto* rows = reinterpret_cast<std::byte*>(out.mutable_data());
  py::gil_scoped_release unlocked;
  for (size_t k = 0; k < n; ++k)
    initial_row(spec, id[k], std::span<std::byte>(rows + k * spec.row_bytes(), spec.row_bytes()));
  return out;
}

py::array initial_rows(const py::array& ids, uint32_t dim, const std::string& dtype,
                       const py::tuple& init, uint64_t seed) {
  if (ids.ndim() != 1 ||
      !(py::isinstance<py::array_t<uint64_t>>(ids) || py::isinstance<py::array_t<int64_t>>(ids)))
    fail(ErrorCode::invalid_argument,
         "initial_rows: ids must be a 1-D array of uint64 or int64, not {}-D {}", ids.ndim(),
         py::str(ids.dtype()).cast<std::string>());
  TableSpec spec{
      .name = "(initial_rows)", .num_embeddings = 1, .dim = dim, .dtype = dtype_named(dtype)};
  spec.init = row_init(init);
  spec.seed = seed;
  RowTable::check_spec(spec);  // the init's bounds, a dim above 0
  // int64 ids are read as their uint64 bits, as the client sends them.
  const py::object bits = py::isinstance<py::array_t<int64_t>>(ids)
                              ? py::object(ids.attr("view")("uint64"))
                              : py::object(ids);
  const auto as_u64 = py::array_t<uint64_t, py::array::c_style>::ensure(bits);
  if (spec.dtype == DType::float64) return initial_rows_of<double>(spec, as_u64);
  return initial_rows_of<float>(spec, as_u64);
}

py::dict export_model_from(const std::vector<std::filesystem::path>& from,
                           const std::filesystem::path& to, bool with_optimizer_state) {
  ExportReport r;
  {
    py::gil_scoped_release unlocked;
    r = export_model({.from = from, .to = to, .with_optimizer_state = with_optimizer_state});
  }
  py::dict out;
  out["shards"] = r.shards;
  out["step"] = r.step;
  out["variables"] = r.variables;
  out["tables"] = r.tables;
  out["rows"] = r.rows;
  out["bytes_written"] = r.bytes_written;
  return out;
}

}  // namespace

void bind_export(py::module_& m) {
  m.def("initial_rows", &initial_rows, py::arg("ids"), py::arg("dim"), py::arg("dtype"),
        py::arg("init"), py::arg("seed"),
        "The initial rows of `ids` (1-D uint64 or int64) in a table of `dim` elements a row, "
        "`dtype` ('float32', 'float64'), `init` (('zeros',), ('uniform', low, high), ('normal', "
        "mean, std)) and `seed`: a new (len(ids), dim) array, computed by the shards' own "
        "function (actors/shard/row_init.h), so bit for bit what a shard answers for a row "
        "never updated.");
  m.def("export_model", &export_model_from, py::arg("from_dirs"), py::arg("to"),
        py::arg("with_optimizer_state") = false,
        "psched export: the model of the stopped job whose checkpoints are in `from_dirs` "
        "written into the new folder `to` (.npy files and manifest.json; "
        "actors/shard/model_export.h). Returns a dict: shards, step, variables, tables, rows, "
        "bytes_written. Raises psched.Error naming what is wrong, writing nothing.");
}

}  // namespace psched::python
