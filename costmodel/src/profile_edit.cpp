#include "dplan/costmodel/profile_edit.h"

namespace dplan::costmodel {
namespace {
json::json_pointer pointer_of(const std::string& path) {
  std::string p = "/" + path;
  for (char& c : p)
    if (c == '.') c = '/';
  return json::json_pointer(p);
}
}  // namespace

json pick_figures(const json& figures, const std::vector<std::string>& paths) {
  json out = json::object();
  for (const auto& path : paths) out[path] = figures.at(pointer_of(path));
  return out;
}

void put_figures(json& profile_object, const json& picked) {
  for (const auto& [path, value] : picked.items()) profile_object[pointer_of(path)] = value;
}

}  // namespace dplan::costmodel
