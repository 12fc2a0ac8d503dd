// Record<T>: binds a C++ struct as a Python class from one list of fields (constructor, repr, ==, as_dict, pickle).
//
// Each field is named once, in its binding line; everything generic about a record (the keyword constructor,
// __repr__, __eq__, as_dict() for JSON, pickling across processes) is built from that list here. A field
// stored in another form than Python shows it (an enum as its name, -1 as None) takes a getter and a setter.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace gpuguard::python {

namespace py = pybind11;

template <typename T>
class Record {
 public:
  struct Field {
    std::string name;
    std::function<py::object(const T&)> get;
    std::function<void(T&, py::handle)> set;  // empty for a derived field: read-only, not part of the state
  };
  using Fields = std::vector<Field>;

  Record(py::handle scope, const char* name, const char* doc)
      : cls_(scope, name, doc), fields_(std::make_shared<Fields>()), name_(name) {}

  // A data member, shown as it is.
  template <typename M>
  Record& field(const char* name, M T::*member) {
    add(name, [member](const T& t) { return py::cast(t.*member); },
        [member](T& t, py::handle v) { t.*member = v.cast<M>(); });
    cls_.def_readwrite(name, member);
    return *this;
  }

  // A field Python sees as an R that the struct keeps in another form.
  template <typename R, typename Get, typename Set>
  Record& field(const char* name, Get get, Set set) {
    add(name, [get](const T& t) { return py::cast(R(get(t))); }, [set](T& t, py::handle v) { set(t, v.cast<R>()); });
    cls_.def_property(name, [get](const T& t) { return R(get(t)); }, [set](T& t, const R& v) { set(t, v); });
    return *this;
  }

  // Computed from the other fields: read-only, in as_dict() but not in the constructor or the pickled state.
  template <typename R, typename Get>
  Record& derived(const char* name, Get get) {
    add(name, [get](const T& t) { return py::cast(R(get(t))); }, nullptr);
    cls_.def_property_readonly(name, [get](const T& t) { return R(get(t)); });
    return *this;
  }

  // For methods and properties that are not fields.
  py::class_<T>& cls() { return cls_; }

  // Adds the generic methods; call once, after the last field.
  py::class_<T>& done() {
    auto fields = fields_;
    std::string name = name_;
    py::list names;
    for (const auto& f : *fields) names.append(f.name);
    cls_.attr("_fields") = py::tuple(names);
    cls_.def(py::init([fields, name](py::args args, py::kwargs kwargs) {
      T t;
      std::vector<const Field*> settable;
      for (const auto& f : *fields) {
        if (f.set) settable.push_back(&f);
      }
      if (args.size() > settable.size()) {
        throw py::type_error(name + "() takes at most " + std::to_string(settable.size()) +
                             " positional arguments (" + std::to_string(args.size()) + " given)");
      }
      for (std::size_t i = 0; i < args.size(); ++i) assign(name, *settable[i], t, args[i]);
      for (auto item : kwargs) {
        std::string key = py::str(item.first);
        auto it = std::find_if(settable.begin(), settable.end(), [&](const Field* f) { return f->name == key; });
        if (it == settable.end()) {
          throw py::type_error(name + "() got an unexpected keyword argument '" + key + "'");
        }
        if (static_cast<std::size_t>(it - settable.begin()) < args.size()) {
          throw py::type_error(name + "() got multiple values for argument '" + key + "'");
        }
        assign(name, **it, t, item.second);
      }
      return t;
    }));
    cls_.def("__repr__", [fields, name](const T& t) {
      std::string out = name + "(";
      bool first = true;
      for (const auto& f : *fields) {
        if (!f.set) continue;
        out += (first ? "" : ", ") + f.name + "=" + std::string(py::repr(f.get(t)));
        first = false;
      }
      return out + ")";
    });
    cls_.def("__eq__", [fields](const T& a, const T& b) {
      for (const auto& f : *fields) {
        if (f.set && !f.get(a).equal(f.get(b))) return false;
      }
      return true;
    }, py::is_operator());
    cls_.def("as_dict", [fields](const T& t) {
      py::dict out;
      for (const auto& f : *fields) out[py::str(f.name)] = plain(f.get(t));
      return out;
    }, "The fields as plain data (dicts, lists, str, numbers, None), nested records included: for JSON.");
    cls_.def(py::pickle(
        [fields](const T& t) {
          py::list state;
          for (const auto& f : *fields) {
            if (f.set) state.append(f.get(t));
          }
          return py::tuple(state);
        },
        [fields, name](const py::tuple& state) {
          T t;
          std::size_t i = 0;
          for (const auto& f : *fields) {
            if (!f.set) continue;
            if (i >= state.size()) throw py::value_error(name + ": pickled state too short");
            assign(name, f, t, state[i++]);
          }
          return t;
        }));
    return cls_;
  }

 private:
  void add(const char* name, std::function<py::object(const T&)> get, std::function<void(T&, py::handle)> set) {
    fields_->push_back(Field{name, std::move(get), std::move(set)});
  }

  static void assign(const std::string& cls, const Field& f, T& t, py::handle value) {
    try {
      f.set(t, value);
    } catch (const py::cast_error&) {
      throw py::type_error(cls + "." + f.name + " cannot be " + std::string(py::repr(value)) + " (" +
                           std::string(py::str(py::type::handle_of(value).attr("__name__"))) + ")");
    }
  }

  // Records become dicts, sequences lists; everything else is already plain.
  static py::object plain(py::handle v) {
    if (py::hasattr(py::type::handle_of(v), "_fields") && py::hasattr(v, "as_dict")) return v.attr("as_dict")();
    if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
      py::list out;
      for (auto item : v) out.append(plain(item));
      return out;
    }
    return py::reinterpret_borrow<py::object>(v);
  }

  py::class_<T> cls_;
  std::shared_ptr<Fields> fields_;
  std::string name_;
};

}  // namespace gpuguard::python
