// libnvrtc.so of kiln's emulated CUDA device: "compiles" CUDA C by building it with the host
// C++ compiler into a shared library, with `device.h` supplying CUDA's built-ins and a
// launcher per entry point. The "PTX" it returns names that library; the emulated driver
// (driver.cpp) loads it.
//
// Compiled libraries are cached under $KILN_EMULATOR_CACHE (default /tmp/kiln-emulator-cache)
// by a hash of the source and the compiler flags.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#ifndef KILN_EMULATOR_HEADER
#error "build with -DKILN_EMULATOR_HEADER=\"/path/to/device.h\""
#endif

typedef int nvrtcResult;
enum {
  NVRTC_SUCCESS = 0,
  NVRTC_ERROR_OUT_OF_MEMORY = 1,
  NVRTC_ERROR_INVALID_INPUT = 3,
  NVRTC_ERROR_INVALID_PROGRAM = 4,
  NVRTC_ERROR_INVALID_OPTION = 5,
  NVRTC_ERROR_COMPILATION = 6,
};

struct Program {
  std::string source, name, ptx, log;
  // Compiled for a real architecture (`sm_XY`): NVRTC then also gives a cubin.
  bool cubin = false;
};

// The architectures NVRTC 13.0 compiles for, or $KILN_EMULATOR_ARCHS (a comma-separated
// list: "75,80,86" makes the emulated sm_90 device newer than NVRTC knows).
static std::vector<int> supported_archs() {
  std::vector<int> archs = {75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121};
  if (const char* e = getenv("KILN_EMULATOR_ARCHS")) {
    archs.clear();
    for (const char* c = e; *c;) {
      archs.push_back(atoi(c));
      while (*c && *c != ',') c++;
      if (*c == ',') c++;
    }
  }
  return archs;
}
typedef Program* nvrtcProgram;

// No contraction (kiln compiles with --fmad=false), wrapping integer arithmetic (as PTX's),
// errno-free math. $KILN_EMULATOR_CXXFLAGS adds more (`-fsanitize=alignment` checks the
// 16-byte vector paths, at twice the compile time).
static std::string flags() {
  std::string f = "-std=c++17 -O1 -fPIC -shared -ffp-contract=off -fwrapv -fno-math-errno -w";
  const char* extra = getenv("KILN_EMULATOR_CXXFLAGS");
  if (extra && *extra) f += std::string(" ") + extra;
  return f;
}

// One parameter of an entry point's signature: its type (without `__restrict__`) and name.
static bool parse_params(const std::string& list, std::vector<std::string>& types) {
  size_t at = 0;
  while (at < list.size()) {
    size_t comma = list.find(',', at);
    std::string p = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? list.size() : comma + 1;
    size_t r;
    while ((r = p.find("__restrict__")) != std::string::npos) p.erase(r, 12);
    while (!p.empty() && p.back() == ' ') p.pop_back();
    size_t name = p.find_last_of(" *");
    if (name == std::string::npos) return false;
    types.push_back(p.substr(0, name + 1));
  }
  return true;
}

// A launcher `kiln_emulator_launch_<name>` for every `extern "C" __global__ void name(...)`.
static bool launchers(const std::string& src, std::string& out, std::string& log) {
  const std::string marker = "extern \"C\" __global__ void ";
  bool cooperative = src.find("__syncthreads") != std::string::npos ||
                     src.find("__shfl") != std::string::npos;
  size_t at = 0;
  int count = 0;
  while ((at = src.find(marker, at)) != std::string::npos) {
    at += marker.size();
    // `__launch_bounds__(threads)` (a row group's) comes before the name.
    const std::string bounds = "__launch_bounds__(";
    if (src.compare(at, bounds.size(), bounds) == 0) {
      size_t end = src.find(')', at);
      if (end == std::string::npos) return false;
      at = src.find_first_not_of(' ', end + 1);
    }
    size_t open = src.find('(', at), close = src.find(')', open);
    if (open == std::string::npos || close == std::string::npos) return false;
    std::string name = src.substr(at, open - at);
    std::vector<std::string> types;
    if (!parse_params(src.substr(open + 1, close - open - 1), types)) {
      log += "cannot read the parameters of " + name + "\n";
      return false;
    }
    out += "namespace {\nstruct env_" + name + " { void** p; };\n";
    out += "void body_" + name + "(void* e) {\n  void** p = ((env_" + name + "*)e)->p;\n  " + name + "(";
    for (size_t i = 0; i < types.size(); i++) {
      if (i) out += ", ";
      out += "*(" + types[i] + "*)p[" + std::to_string(i) + "]";
    }
    out += ");\n}\n}\n";
    out += "extern \"C\" int kiln_emulator_launch_" + name +
           "(void** p, const unsigned* grid, const unsigned* block) {\n  env_" + name +
           " e{p};\n  return kemu::launch(grid, block, " + (cooperative ? "true" : "false") +
           ", body_" + name + ", &e, \"" + name + "\");\n}\n";
    out += "extern \"C\" const unsigned kiln_emulator_params_" + name + " = " +
           std::to_string(types.size()) + ";\n";
    // Each parameter's size, so that a captured launch can keep a copy of its arguments.
    out += "extern \"C\" const unsigned kiln_emulator_sizes_" + name + "[] = {";
    for (size_t i = 0; i < types.size(); i++) out += "sizeof(" + types[i] + "), ";
    out += "0};\n";
    unsigned long long pointers = 0;
    for (size_t i = 0; i < types.size() && i < 64; i++)
      if (types[i].find('*') != std::string::npos) pointers |= 1ULL << i;
    out += "extern \"C\" const unsigned long long kiln_emulator_pointers_" + name + " = " +
           std::to_string(pointers) + "ULL;\n";
    count++;
  }
  if (count == 0) log += "no extern \"C\" __global__ entry point\n";
  return count > 0;
}

static uint64_t fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

static std::string cache_dir() {
  const char* d = getenv("KILN_EMULATOR_CACHE");
  std::string dir = d && *d ? d : "/tmp/kiln-emulator-cache";
  mkdir(dir.c_str(), 0777);
  return dir;
}

static std::string read_file(const std::string& path) {
  std::string s;
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return s;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  fclose(f);
  return s;
}

extern "C" {

nvrtcResult nvrtcVersion(int* major, int* minor) {
  *major = 13;
  *minor = 0;
  return NVRTC_SUCCESS;
}

const char* nvrtcGetErrorString(nvrtcResult r) {
  switch (r) {
    case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
    case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
    default: return "NVRTC_ERROR";
  }
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name, int headers,
                               const char* const*, const char* const*) {
  if (!prog || !src) return NVRTC_ERROR_INVALID_INPUT;
  if (headers != 0) return NVRTC_ERROR_INVALID_INPUT;  // kiln's kernels include nothing
  Program* p = new Program();
  p->source = src;
  p->name = name ? name : "kernel.cu";
  *prog = p;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog) {
  if (!prog || !*prog) return NVRTC_ERROR_INVALID_PROGRAM;
  delete *prog;
  *prog = nullptr;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int n, const char* const* options) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  for (int i = 0; i < n; i++) {
    // Contraction would round differently from the CPU: kiln must ask for none.
    if (strcmp(options[i], "--fmad=true") == 0) p->log += "warning: --fmad=true is emulated as false\n";
    // As NVRTC: an architecture it does not know is an error; a real one gives a cubin.
    const char* arch = "--gpu-architecture=";
    if (strncmp(options[i], arch, strlen(arch)) == 0) {
      const char* value = options[i] + strlen(arch);
      bool real = strncmp(value, "sm_", 3) == 0;
      if (!real && strncmp(value, "compute_", 8) != 0) {
        p->log += std::string("nvrtc: error: invalid value for --gpu-architecture: ") + value + "\n";
        return NVRTC_ERROR_INVALID_OPTION;
      }
      int number = atoi(value + (real ? 3 : 8));
      std::vector<int> archs = supported_archs();
      if (std::find(archs.begin(), archs.end(), number) == archs.end()) {
        p->log += std::string("nvrtc: error: invalid value for --gpu-architecture: ") + value + "\n";
        return NVRTC_ERROR_INVALID_OPTION;
      }
      p->cubin = real;
    }
  }
  std::string launch;
  if (!launchers(p->source, launch, p->log)) return NVRTC_ERROR_COMPILATION;
  std::string cxx = getenv("CXX") && *getenv("CXX") ? getenv("CXX") : "c++";
  std::string text = "#include \"" KILN_EMULATOR_HEADER "\"\n" + p->source + "\n" + launch;
  std::string cxxflags = flags();
  // The header's text is part of the key: a changed emulator rebuilds every kernel.
  std::ifstream header(KILN_EMULATOR_HEADER);
  std::string header_text((std::istreambuf_iterator<char>(header)), std::istreambuf_iterator<char>());
  uint64_t key = fnv1a(text + header_text, fnv1a(cxx + cxxflags));
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)key);
  std::string dir = cache_dir(), base = dir + "/k" + hex, so = base + ".so";
  if (access(so.c_str(), R_OK) != 0) {
    // Unique temporaries, renamed into place: concurrent compiles of one source are safe.
    std::string tmp = base + "." + std::to_string(getpid()) + "." +
                      std::to_string((unsigned long long)(uintptr_t)p);
    FILE* f = fopen((tmp + ".cpp").c_str(), "wb");
    if (!f) {
      p->log += "cannot write " + tmp + ".cpp\n";
      return NVRTC_ERROR_COMPILATION;
    }
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
    std::string cmd = cxx + " " + cxxflags + " -o " + tmp + ".so " + tmp + ".cpp > " + tmp +
                      ".log 2>&1";
    int rc = system(cmd.c_str());
    p->log += read_file(tmp + ".log");
    remove((tmp + ".log").c_str());
    if (rc != 0) {
      p->log += "(the source is kept in " + tmp + ".cpp)\n";
      remove((tmp + ".so").c_str());
      return NVRTC_ERROR_COMPILATION;
    }
    remove((tmp + ".cpp").c_str());
    rename((tmp + ".so").c_str(), so.c_str());
  }
  p->ptx = "// kiln emulator module\n" + so + "\n";
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetPTXSize(nvrtcProgram p, size_t* size) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  *size = p->ptx.size() + 1;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetPTX(nvrtcProgram p, char* out) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  memcpy(out, p->ptx.c_str(), p->ptx.size() + 1);
  return NVRTC_SUCCESS;
}

// The "cubin" names the same shared library, with a marker of its own, so that the emulated
// driver can refuse it ($KILN_EMULATOR_REJECT_CUBIN) to exercise the PTX fallback.
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram p, size_t* size) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  *size = p->cubin ? p->ptx.size() + 1 : 0;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBIN(nvrtcProgram p, char* out) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!p->cubin) return NVRTC_ERROR_INVALID_INPUT;
  std::string image = "// kiln emulator cubin\n" + p->ptx.substr(strlen("// kiln emulator module\n"));
  memcpy(out, image.c_str(), std::min(image.size() + 1, p->ptx.size() + 1));
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetNumSupportedArchs(int* n) {
  *n = (int)supported_archs().size();
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetSupportedArchs(int* out) {
  std::vector<int> archs = supported_archs();
  std::copy(archs.begin(), archs.end(), out);
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram p, size_t* size) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  *size = p->log.size() + 1;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram p, char* out) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  memcpy(out, p->log.c_str(), p->log.size() + 1);
  return NVRTC_SUCCESS;
}
}
