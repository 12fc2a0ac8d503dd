// gpuguard._core.Scanner: the C++ log reader (gpuguard/log_scan.h) for Python, through the bare CPython API.
//
// Written against the CPython API rather than pybind11 because it is the hot path of `gpuguard explain`: feed()
// takes any buffer without a copy, releases the GIL while scanning, and builds its result tuples directly.
#define PY_SSIZE_T_CLEAN
#include "scanner.h"

#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpuguard/log_scan.h"

namespace {

struct ScannerObject {
  PyObject_HEAD
  gpuguard::LogScanner* scanner;
};

PyObject* lines_to_list(std::vector<gpuguard::ScannedLine> lines) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(lines.size()));
  if (list == nullptr) return nullptr;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& l = lines[i];
    PyObject* item = Py_BuildValue("(KOy#K)", static_cast<unsigned long long>(l.number), l.hit ? Py_True : Py_False,
                                   l.text.data(), static_cast<Py_ssize_t>(l.text.size()),
                                   static_cast<unsigned long long>(l.keywords));
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);
  }
  return list;
}

// A sequence of bytes (UTF-8 keywords) into `out`; false with a Python error set when it is not one.
bool bytes_list(PyObject* items, const char* what, std::vector<std::string>* out) {
  PyObject* seq = PySequence_Fast(items, "Scanner: expected a sequence of bytes");
  if (seq == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyBytes_Check(item)) {
      Py_DECREF(seq);
      PyErr_Format(PyExc_TypeError, "Scanner: every one of %s must be bytes (UTF-8)", what);
      return false;
    }
    out->emplace_back(PyBytes_AS_STRING(item), static_cast<std::size_t>(PyBytes_GET_SIZE(item)));
  }
  Py_DECREF(seq);
  return true;
}

// A sequence of group numbers (None: none given) into `out`; false with a Python error set when one is invalid.
bool group_list(PyObject* items, const char* what, std::vector<std::uint8_t>* out) {
  if (items == Py_None) return true;
  PyObject* seq = PySequence_Fast(items, "Scanner: expected a sequence of ints");
  if (seq == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    long g = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (g == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return false;
    }
    if (g < 0 || g >= static_cast<long>(gpuguard::KeywordSearch::kMaxGroups)) {
      Py_DECREF(seq);
      PyErr_Format(PyExc_ValueError, "Scanner: %s: group %ld is out of range (0 to %d)", what, g,
                   static_cast<int>(gpuguard::KeywordSearch::kMaxGroups) - 1);
      return false;
    }
    out->push_back(static_cast<std::uint8_t>(g));
  }
  Py_DECREF(seq);
  return true;
}

int scanner_init(ScannerObject* self, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"keywords", "max_line_bytes", "context_lines", "context_line_bytes", "groups",
                                "lines_after", "line_end_heads", "line_end_groups", nullptr};
  PyObject* keywords = nullptr;
  PyObject* groups = Py_None;
  PyObject* heads = Py_None;
  PyObject* head_groups = Py_None;
  gpuguard::LogScanLimits limits;
  Py_ssize_t max_line = static_cast<Py_ssize_t>(limits.max_line_bytes);
  Py_ssize_t context_lines = static_cast<Py_ssize_t>(limits.context_lines);
  Py_ssize_t context_bytes = static_cast<Py_ssize_t>(limits.context_line_bytes);
  Py_ssize_t lines_after = static_cast<Py_ssize_t>(limits.lines_after);
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|nnnOnOO", const_cast<char**>(names), &keywords, &max_line,
                                   &context_lines, &context_bytes, &groups, &lines_after, &heads, &head_groups))
    return -1;
  if (max_line <= 0 || context_lines < 0 || context_bytes <= 0 || lines_after < 0) {
    PyErr_SetString(PyExc_ValueError, "Scanner: max_line_bytes and context_line_bytes must be positive, "
                                      "context_lines and lines_after not negative");
    return -1;
  }
  std::vector<std::string> words, head_words;
  std::vector<std::uint8_t> group_of, head_group_of;
  if (!bytes_list(keywords, "keywords", &words) || !group_list(groups, "groups", &group_of)) return -1;
  if (heads != Py_None && !bytes_list(heads, "line_end_heads", &head_words)) return -1;
  if (!group_list(head_groups, "line_end_groups", &head_group_of)) return -1;
  limits.max_line_bytes = static_cast<std::size_t>(max_line);
  limits.context_lines = static_cast<std::size_t>(context_lines);
  limits.context_line_bytes = static_cast<std::size_t>(context_bytes);
  limits.lines_after = static_cast<std::size_t>(lines_after);
  try {
    delete self->scanner;
    self->scanner = new gpuguard::LogScanner(std::move(words), limits, std::move(group_of),
                                             gpuguard::LineEndTest(std::move(head_words), std::move(head_group_of)));
  } catch (const std::invalid_argument& e) {
    self->scanner = nullptr;
    PyErr_SetString(PyExc_ValueError, e.what());
    return -1;
  } catch (const std::bad_alloc&) {
    self->scanner = nullptr;
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

void scanner_dealloc(ScannerObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  delete self->scanner;
  type->tp_free(reinterpret_cast<PyObject*>(self));
  Py_DECREF(type);  // a heap type is owned by its instances
}

bool ready(ScannerObject* self) {
  if (self->scanner != nullptr) return true;
  PyErr_SetString(PyExc_RuntimeError, "Scanner was not initialised");
  return false;
}

PyObject* scanner_feed(ScannerObject* self, PyObject* arg) {
  if (!ready(self)) return nullptr;
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return nullptr;
  std::vector<gpuguard::ScannedLine> out;
  bool oom = false;
  Py_BEGIN_ALLOW_THREADS
  try {
    self->scanner->feed(std::string_view(static_cast<const char*>(view.buf), static_cast<std::size_t>(view.len)));
    out = self->scanner->take();
  } catch (const std::bad_alloc&) {
    oom = true;
  }
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&view);
  if (oom) return PyErr_NoMemory();
  return lines_to_list(std::move(out));
}

PyObject* scanner_finish(ScannerObject* self, PyObject*) {
  if (!ready(self)) return nullptr;
  self->scanner->finish();
  return lines_to_list(self->scanner->take());
}

PyObject* scanner_lines(ScannerObject* self, void*) {
  if (!ready(self)) return nullptr;
  return PyLong_FromUnsignedLongLong(self->scanner->lines());
}

PyObject* scanner_hits(ScannerObject* self, void*) {
  if (!ready(self)) return nullptr;
  return PyLong_FromUnsignedLongLong(self->scanner->hits());
}

PyMethodDef scanner_methods[] = {
    {"feed", reinterpret_cast<PyCFunction>(scanner_feed), METH_O,
     "feed(data) -> [(line_number, is_hit, bytes, groups)]: the lines handed out from the next bytes of the "
     "stream; groups has bit g set when a keyword of group g is in a hit"},
    {"finish", reinterpret_cast<PyCFunction>(scanner_finish), METH_NOARGS,
     "finish() -> [(line_number, is_hit, bytes, groups)]: the stream ended; judges a last unterminated line"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef scanner_getset[] = {
    {"lines", reinterpret_cast<getter>(scanner_lines), nullptr, "lines read so far", nullptr},
    {"hits", reinterpret_cast<getter>(scanner_hits), nullptr, "lines that held a keyword so far", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

const char kScannerDoc[] =
    "Scanner(keywords, max_line_bytes=16384, context_lines=64, context_line_bytes=1024, groups=None, lines_after=1, "
    "line_end_heads=None, line_end_groups=None): splits a byte stream into lines and hands out those holding a "
    "keyword or ending with one of line_end_heads, the lines_after lines after each and the context_lines lines "
    "before each; groups[i] is the bit keyword i sets (default: i), line_end_groups[i] the bit head i sets.";

PyType_Slot scanner_slots[] = {
    {Py_tp_doc, const_cast<char*>(kScannerDoc)},
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
    {Py_tp_init, reinterpret_cast<void*>(scanner_init)},
    {Py_tp_dealloc, reinterpret_cast<void*>(scanner_dealloc)},
    {Py_tp_methods, scanner_methods},
    {Py_tp_getset, scanner_getset},
    {0, nullptr}};

PyType_Spec scanner_spec = {"gpuguard._core.Scanner", sizeof(ScannerObject), 0, Py_TPFLAGS_DEFAULT, scanner_slots};

}  // namespace

namespace gpuguard::python {

void add_scanner(pybind11::module_& m) {
  PyObject* type = PyType_FromSpec(&scanner_spec);
  if (type == nullptr) throw pybind11::error_already_set();
  m.add_object("Scanner", pybind11::reinterpret_steal<pybind11::object>(type));
  m.attr("MIN_KEYWORD_BYTES") = static_cast<long>(gpuguard::KeywordSearch::kMinKeywordBytes);
}

}  // namespace gpuguard::python
