/*
 * TEST DOUBLE of libedgetpu: not the Edge TPU runtime.
 *
 * It implements, with the signatures of libedgetpu's public edgetpu_c.h, the C API
 * the service calls through ctypes (edgetpu_list_devices, edgetpu_free_devices,
 * edgetpu_version), and the TFLite external-delegate entry points that
 * `load_delegate()` calls (tflite_plugin_create_delegate / _destroy_delegate).
 * Tests compile it with gcc and point EDGETPU_SERVE_EDGETPU_LIBRARY at it.
 *
 * What it pretends, set by environment variables read at each call:
 *   EDGETPU_TEST_DOUBLE_DEVICES  comma-separated TYPE:PATH, TYPE = usb | pci,
 *                                e.g. "usb:/sys/bus/usb/devices/2-1,pci:/dev/apex_0";
 *                                unset or empty = no device.
 *   EDGETPU_TEST_DOUBLE_DEVICES_FILE  a file read again at every call, holding the same list
 *                                (commas or newlines between entries): TPUs plugged in and
 *                                unplugged while a process runs. When set, it replaces
 *                                EDGETPU_TEST_DOUBLE_DEVICES; a missing file = no device.
 *   EDGETPU_TEST_DOUBLE_VERSION  what edgetpu_version() returns.
 *   EDGETPU_TEST_DOUBLE_OPEN     "fail": every delegate creation fails (as when the
 *                                device exists but cannot be opened).
 *   EDGETPU_TEST_DOUBLE_LOG      file that gets one line per delegate created/destroyed,
 *                                with the options received, for tests to assert on.
 *   EDGETPU_TEST_DOUBLE_INVOKE_LOG  file that gets one line per invocation of a delegated
 *                                kernel, "invoked device=SPEC ops=N QUANTIZE:uint8>int8 ...",
 *                                so a test can see which device's delegate computed what.
 *   EDGETPU_TEST_DOUBLE_EXCLUSIVE  "1": a device is one process's, as a USB Accelerator is (its
 *                                interface claimed): a delegate takes a POSIX lock on the device's
 *                                path (a file the test made), held while any delegate of this
 *                                process is on it; another process's delegate on it is refused
 *                                ("busy device=SPEC path=PATH holder=PID pid=PID" in the log).
 *                                Its "created"/"destroyed" lines then end in " pid=PID path=PATH".
 *
 * Its delegate is a real TfLiteDelegate: it claims every QUANTIZE operator that converts
 * between uint8 and int8 with per-tensor parameters (the first and last operators of the
 * Edge TPU's uint8-in, uint8-out models) and computes them itself, in double precision,
 * q_out = clamp(round_half_away(s_in / s_out * (q_in - zp_in)) + zp_out), which equals
 * TFLite's integer requantization for these models (equal scales). It also claims every
 * `edgetpu-custom-op` node whose tensors are all 8-bit (what edgetpu_compiler writes, and
 * tests/doubles/compiled_model_double.py imitates), as libedgetpu does, and fills each output
 * with a stand-in: byte i of the output is byte i (cycling) of the first input. The TPU's
 * program is not run: a compiled model loads and answers, its numbers are not a model's.
 * Everything else stays on the runtime's CPU kernels. So a request served through it really runs delegated kernels
 * (counted, and logged per device), and a wrong computation or a missing delegate shows in
 * the outputs or the counts; the TPU's own arithmetic is still not modelled.
 * A delegate remembers the path of the TPU it opened; once that TPU is no longer listed (unplugged),
 * each invoke of its kernels fails (kTfLiteError, and the error reported to the runtime), as a
 * real invoke on a TPU that left does.
 * Device selection follows libedgetpu's rules for the "device" option ("", ":N", "usb",
 * "usb:N", "pci", "pci:N"): a spec that names no listed device gives no delegate.
 *
 * The TFLite structures below are declared here with the layout of TFLite's C API
 * (tensorflow/lite/core/c/common.h, whose fields are only ever appended), as far as the
 * double uses them; TfLiteRegistration is declared whole, because it is passed by value.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum edgetpu_device_type {
  EDGETPU_APEX_PCI = 0,
  EDGETPU_APEX_USB = 1,
};

struct edgetpu_device {
  enum edgetpu_device_type type;
  const char* path;
};

#define DEFAULT_VERSION \
  "BuildLabel(COMPILER=test double,DATE=redacted,TIME=redacted), RuntimeVersion(14)"
#define DELEGATE_BYTES 512 /* larger than any TfLiteDelegate layout; zero = no callbacks */

static int live_device_lists = 0;

/* The list as text: the file's content when EDGETPU_TEST_DOUBLE_DEVICES_FILE is set, else the
 * variable; NULL = no device. The caller frees it. */
static char* device_spec(void) {
  const char* file = getenv("EDGETPU_TEST_DOUBLE_DEVICES_FILE");
  if (file == NULL) {
    const char* spec = getenv("EDGETPU_TEST_DOUBLE_DEVICES");
    return spec ? strdup(spec) : NULL;
  }
  FILE* f = fopen(file, "r");
  if (f == NULL) return NULL;
  size_t capacity = 256, size = 0;
  char* text = malloc(capacity);
  size_t got;
  while ((got = fread(text + size, 1, capacity - size - 1, f)) > 0) {
    size += got;
    if (size + 1 == capacity) text = realloc(text, capacity *= 2);
  }
  fclose(f);
  text[size] = '\0';
  return text;
}

/* Parses the list (device_spec); the caller frees with edgetpu_free_devices. */
struct edgetpu_device* edgetpu_list_devices(size_t* num_devices) {
  *num_devices = 0;
  char* copy = device_spec();
  if (copy == NULL || *copy == '\0') {
    free(copy);
    return NULL;
  }

  size_t capacity = 1;
  for (const char* c = copy; *c; ++c) capacity += (*c == ',' || *c == '\n');
  struct edgetpu_device* devices = calloc(capacity + 1, sizeof *devices);
  char* save = NULL;
  for (char* item = strtok_r(copy, ",\n", &save); item; item = strtok_r(NULL, ",\n", &save)) {
    char* colon = strchr(item, ':');
    if (colon == NULL) continue;
    *colon = '\0';
    enum edgetpu_device_type type;
    if (strcmp(item, "usb") == 0) type = EDGETPU_APEX_USB;
    else if (strcmp(item, "pci") == 0) type = EDGETPU_APEX_PCI;
    else continue;
    devices[*num_devices].type = type;
    devices[*num_devices].path = strdup(colon + 1);
    ++*num_devices;
  }
  free(copy);
  if (*num_devices == 0) {
    free(devices);
    return NULL;
  }
  ++live_device_lists;
  return devices;
}

void edgetpu_free_devices(struct edgetpu_device* dev) {
  if (dev == NULL) return;
  for (struct edgetpu_device* d = dev; d->path != NULL; ++d) free((void*)d->path);
  free(dev);
  --live_device_lists;
}

const char* edgetpu_version(void) {
  const char* version = getenv("EDGETPU_TEST_DOUBLE_VERSION");
  return version ? version : DEFAULT_VERSION;
}

void edgetpu_verbosity(int verbosity) { (void)verbosity; }

/* Not in libedgetpu: lets tests check that every list was freed. */
int edgetpu_test_double_live_device_lists(void) { return live_device_lists; }

/* ---- the TFLite C API, as far as the delegate uses it ---- */

enum { kTfLiteOk = 0, kTfLiteError = 1 };
enum { kTfLiteUInt8 = 3, kTfLiteInt8 = 9 };
enum { kTfLiteBuiltinQuantize = 114 };
enum { kTfLiteAffineQuantization = 1 };

typedef struct TfLiteIntArray {
  int size;
  int data[];
} TfLiteIntArray;

typedef struct TfLiteTensor {
  int type;
  void* data;
  TfLiteIntArray* dims;
  struct { float scale; int32_t zero_point; } params;
  int allocation_type;
  size_t bytes;
  const void* allocation;
  const char* name;
  void* delegate;
  int buffer_handle;
  bool data_is_stale;
  bool is_variable;
  struct { int type; void* params; } quantization;
  void* sparsity;
  const TfLiteIntArray* dims_signature;
} TfLiteTensor;

/* scale is a TfLiteFloatArray*, whose layout has changed between releases: only zero_point is read */
typedef struct { void* scale; TfLiteIntArray* zero_point; int32_t quantized_dimension; } TfLiteAffineQuantization;

typedef struct TfLiteNode {
  TfLiteIntArray* inputs;
  TfLiteIntArray* outputs;
  TfLiteIntArray* intermediates;
  TfLiteIntArray* temporaries;
  void* user_data;
  void* builtin_data;
  const void* custom_initial_data;
  int custom_initial_data_size;
  struct TfLiteDelegate* delegate;
  bool might_have_side_effect;
} TfLiteNode;

struct TfLiteContext;

typedef struct TfLiteRegistration {
  void* (*init)(struct TfLiteContext* context, const char* buffer, size_t length);
  void (*free)(struct TfLiteContext* context, void* buffer);
  int (*prepare)(struct TfLiteContext* context, TfLiteNode* node);
  int (*invoke)(struct TfLiteContext* context, TfLiteNode* node);
  const char* (*profiling_string)(const struct TfLiteContext* context, const TfLiteNode* node);
  int32_t builtin_code;
  const char* custom_name;
  int version;
  void* registration_external;
  void* (*async_kernel)(struct TfLiteContext* context, TfLiteNode* node);
  uint64_t inplace_operator;
} TfLiteRegistration;

typedef struct TfLiteDelegate {
  void* data_;
  int (*Prepare)(struct TfLiteContext* context, struct TfLiteDelegate* delegate);
  void* CopyFromBufferHandle;
  void* CopyToBufferHandle;
  void* FreeBufferHandle;
  int64_t flags;
  void* opaque_delegate_builder;
} TfLiteDelegate;

typedef struct TfLiteContext {
  size_t tensors_size;
  int (*GetExecutionPlan)(struct TfLiteContext* context, TfLiteIntArray** execution_plan);
  TfLiteTensor* tensors;
  void* impl_;
  void* ResizeTensor;
  void (*ReportError)(struct TfLiteContext*, const char* msg, ...);
  void* AddTensors;
  int (*GetNodeAndRegistration)(struct TfLiteContext*, int node_index, TfLiteNode** node,
                                TfLiteRegistration** registration);
  int (*ReplaceNodeSubsetsWithDelegateKernels)(struct TfLiteContext*, TfLiteRegistration registration,
                                               const TfLiteIntArray* nodes_to_replace, TfLiteDelegate* delegate);
} TfLiteContext;

typedef struct TfLiteDelegateParams {
  TfLiteDelegate* delegate;
  TfLiteIntArray* nodes_to_replace;
  TfLiteIntArray* input_tensors;
  TfLiteIntArray* output_tensors;
} TfLiteDelegateParams;

/* What the double keeps per delegate (TfLiteDelegate.data_). */
typedef struct {
  char device[64];  /* the "device" option it was created with */
  char path[512];   /* the listed TPU that option selected (exclusive mode: the one it holds) */
} DoubleDelegate;

#define EDGETPU_CUSTOM_OP "edgetpu-custom-op"
#define MAX_OUTPUTS 8

/* One claimed node: a QUANTIZE (input, output) or an edgetpu-custom-op (first input, its outputs). */
typedef struct {
  bool custom;
  int input;
  int outputs;
  int output[MAX_OUTPUTS];
} DelegatedNode;

/* One delegated kernel: the claimed nodes of one partition. */
typedef struct {
  int count;
  DelegatedNode nodes[];
} DelegatedKernel;

static long invocations = 0;

/* Not in libedgetpu: how many delegated kernels ran in this process, for in-process tests. */
long edgetpu_test_double_invocations(void) { return invocations; }

static bool per_tensor(const TfLiteTensor* t) {
  if (t->quantization.type != kTfLiteAffineQuantization || t->quantization.params == NULL) return true;
  const TfLiteAffineQuantization* q = t->quantization.params;
  return q->zero_point == NULL || q->zero_point->size <= 1;
}

/* A QUANTIZE between uint8 and int8 with one scale per tensor: what this double computes. */
static bool claimable(TfLiteContext* context, const TfLiteNode* node, const TfLiteRegistration* reg) {
  if (reg->builtin_code != kTfLiteBuiltinQuantize || node->inputs->size != 1 || node->outputs->size != 1)
    return false;
  const TfLiteTensor* in = &context->tensors[node->inputs->data[0]];
  const TfLiteTensor* out = &context->tensors[node->outputs->data[0]];
  bool in_ok = in->type == kTfLiteUInt8 || in->type == kTfLiteInt8;
  bool out_ok = out->type == kTfLiteUInt8 || out->type == kTfLiteInt8;
  return in_ok && out_ok && in->type != out->type && per_tensor(in) && per_tensor(out) &&
         in->params.scale > 0 && out->params.scale > 0;
}

static bool is_edgetpu_op(const TfLiteRegistration* reg) {
  return reg->custom_name != NULL && strcmp(reg->custom_name, EDGETPU_CUSTOM_OP) == 0;
}

static bool eight_bit(const TfLiteTensor* t) { return t->type == kTfLiteUInt8 || t->type == kTfLiteInt8; }

/* An edgetpu-custom-op whose tensors are all 8-bit: the double fills its outputs. */
static bool claimable_custom(TfLiteContext* context, const TfLiteNode* node, const TfLiteRegistration* reg) {
  if (!is_edgetpu_op(reg) || node->inputs->size < 1 || node->outputs->size < 1 || node->outputs->size > MAX_OUTPUTS)
    return false;
  if (!eight_bit(&context->tensors[node->inputs->data[0]])) return false;
  for (int i = 0; i < node->outputs->size; ++i)
    if (!eight_bit(&context->tensors[node->outputs->data[i]])) return false;
  return true;
}

static void* kernel_init(TfLiteContext* context, const char* buffer, size_t length) {
  (void)length;
  const TfLiteDelegateParams* params = (const TfLiteDelegateParams*)buffer;
  int n = params->nodes_to_replace->size;
  DelegatedKernel* kernel = calloc(1, sizeof *kernel + (size_t)n * sizeof kernel->nodes[0]);
  for (int i = 0; i < n; ++i) {
    TfLiteNode* node = NULL;
    TfLiteRegistration* reg = NULL;
    if (context->GetNodeAndRegistration(context, params->nodes_to_replace->data[i], &node, &reg) != kTfLiteOk) {
      free(kernel);
      return NULL;
    }
    DelegatedNode* claimed = &kernel->nodes[i];
    claimed->custom = is_edgetpu_op(reg);
    claimed->input = node->inputs->data[0];
    claimed->outputs = claimed->custom ? node->outputs->size : 1;
    for (int k = 0; k < claimed->outputs; ++k) claimed->output[k] = node->outputs->data[k];
  }
  kernel->count = n;
  return kernel;
}

static void kernel_free(TfLiteContext* context, void* buffer) {
  (void)context;
  free(buffer);
}

static int kernel_prepare(TfLiteContext* context, TfLiteNode* node) {
  (void)context;
  return node->user_data == NULL ? kTfLiteError : kTfLiteOk;
}

static const char* type_name(int type) { return type == kTfLiteUInt8 ? "uint8" : "int8"; }

/* "invoked device=SPEC ops=N QUANTIZE:IN>OUT ..." */
static void log_invocation(TfLiteContext* context, const TfLiteDelegate* delegate, const DelegatedKernel* kernel) {
  const char* path = getenv("EDGETPU_TEST_DOUBLE_INVOKE_LOG");
  if (path == NULL) return;
  FILE* f = fopen(path, "a");
  if (f == NULL) return;
  fprintf(f, "invoked device=%s ops=%d", ((const DoubleDelegate*)delegate->data_)->device, kernel->count);
  for (int k = 0; k < kernel->count; ++k)
    fprintf(f, " %s:%s>%s", kernel->nodes[k].custom ? EDGETPU_CUSTOM_OP : "QUANTIZE",
            type_name(context->tensors[kernel->nodes[k].input].type),
            type_name(context->tensors[kernel->nodes[k].output[0]].type));
  fputc('\n', f);
  fclose(f);
}

/* Whether a TPU of this path is listed now. */
static bool listed(const char* path) {
  size_t count = 0;
  struct edgetpu_device* devices = edgetpu_list_devices(&count);
  bool found = false;
  for (size_t i = 0; i < count && !found; ++i) found = strcmp(devices[i].path, path) == 0;
  edgetpu_free_devices(devices);
  return found;
}

/* q_out = clamp(round_half_away(s_in / s_out * (q_in - zp_in)) + zp_out) */
static int kernel_invoke(TfLiteContext* context, TfLiteNode* node) {
  const DelegatedKernel* kernel = node->user_data;
  const DoubleDelegate* opened = node->delegate->data_;
  if (!listed(opened->path)) { /* unplugged since the delegate was created */
    context->ReportError(context, "edgetpu test double: the Edge TPU %s is gone", opened->path);
    return kTfLiteError;
  }
  for (int k = 0; k < kernel->count; ++k) {
    const TfLiteTensor* in = &context->tensors[kernel->nodes[k].input];
    if (kernel->nodes[k].custom) { /* the stand-in: output byte i = input byte i, cycling */
      for (int o = 0; o < kernel->nodes[k].outputs; ++o) {
        TfLiteTensor* target = &context->tensors[kernel->nodes[k].output[o]];
        for (size_t i = 0; i < target->bytes && in->bytes > 0; ++i)
          ((uint8_t*)target->data)[i] = ((const uint8_t*)in->data)[i % in->bytes];
      }
      continue;
    }
    TfLiteTensor* out = &context->tensors[kernel->nodes[k].output[0]];
    const double ratio = (double)in->params.scale / (double)out->params.scale;
    const int lo = out->type == kTfLiteUInt8 ? 0 : -128, hi = out->type == kTfLiteUInt8 ? 255 : 127;
    for (size_t i = 0; i < in->bytes && i < out->bytes; ++i) {
      int q = in->type == kTfLiteUInt8 ? ((const uint8_t*)in->data)[i] : ((const int8_t*)in->data)[i];
      const double x = ratio * (q - in->params.zero_point);
      long v = (x >= 0 ? (long)(x + 0.5) : -(long)(-x + 0.5)) + out->params.zero_point; /* half away from 0 */
      v = v < lo ? lo : v > hi ? hi : v;
      if (out->type == kTfLiteUInt8) ((uint8_t*)out->data)[i] = (uint8_t)v;
      else ((int8_t*)out->data)[i] = (int8_t)v;
    }
  }
  ++invocations;
  log_invocation(context, node->delegate, kernel);
  return kTfLiteOk;
}

/* TfLiteDelegate.Prepare: claim the QUANTIZE and edgetpu-custom-op nodes this double computes. */
static int delegate_prepare(TfLiteContext* context, TfLiteDelegate* delegate) {
  TfLiteIntArray* plan = NULL;
  if (context->GetExecutionPlan(context, &plan) != kTfLiteOk) return kTfLiteError;
  TfLiteIntArray* claimed = calloc(1, sizeof *claimed + (size_t)plan->size * sizeof(int));
  for (int i = 0; i < plan->size; ++i) {
    TfLiteNode* node = NULL;
    TfLiteRegistration* reg = NULL;
    if (context->GetNodeAndRegistration(context, plan->data[i], &node, &reg) != kTfLiteOk) continue;
    if (claimable(context, node, reg) || claimable_custom(context, node, reg))
      claimed->data[claimed->size++] = plan->data[i];
  }
  int status = kTfLiteOk;
  if (claimed->size > 0) {
    TfLiteRegistration kernel = {0};
    kernel.init = kernel_init;
    kernel.free = kernel_free;
    kernel.prepare = kernel_prepare;
    kernel.invoke = kernel_invoke;
    kernel.custom_name = "edgetpu-test-double";
    kernel.version = 1;
    status = context->ReplaceNodeSubsetsWithDelegateKernels(context, kernel, claimed, delegate);
  }
  free(claimed);
  return status;
}

/* Index of the listed device a "device" option names, or -1 (libedgetpu's rules); its path is
 * copied to `path` (`size` bytes) when found. */
static int select_device(const char* option, char* path, size_t size) {
  size_t count = 0;
  struct edgetpu_device* devices = edgetpu_list_devices(&count);
  int chosen = -1;
  int want_type = -1; /* -1 = any type */
  long index = -1;    /* -1 = any index */
  if (option != NULL && *option != '\0') {
    const char* rest = option;
    if (strncmp(option, "usb", 3) == 0) { want_type = EDGETPU_APEX_USB; rest = option + 3; }
    else if (strncmp(option, "pci", 3) == 0) { want_type = EDGETPU_APEX_PCI; rest = option + 3; }
    if (*rest == ':') {
      char* end = NULL;
      index = strtol(rest + 1, &end, 10);
      if (end == rest + 1 || *end != '\0' || index < 0) { edgetpu_free_devices(devices); return -1; }
    } else if (*rest != '\0') {
      edgetpu_free_devices(devices);
      return -1;
    }
  }
  long seen = 0;
  for (size_t i = 0; i < count; ++i) {
    if (want_type != -1 && (int)devices[i].type != want_type) continue;
    if (index == -1 || seen == index) { chosen = (int)i; break; }
    ++seen;
  }
  if (chosen >= 0) snprintf(path, size, "%s", devices[chosen].path);
  edgetpu_free_devices(devices);
  return chosen;
}

static bool exclusive(void) {
  const char* value = getenv("EDGETPU_TEST_DOUBLE_EXCLUSIVE");
  return value != NULL && strcmp(value, "1") == 0;
}

/* Exclusive mode: this process's hold on each device path (a POSIX lock is the process's, and is
 * released when any descriptor of the file closes: one descriptor per path, kept while held). */
#define MAX_HELD 64
static struct { char path[512]; int fd; int delegates; } held[MAX_HELD];

/* 0: held by this process now (or not lockable: no such file); else the pid holding it. */
static int hold_device(const char* path) {
  for (int i = 0; i < MAX_HELD; ++i)
    if (held[i].delegates > 0 && strcmp(held[i].path, path) == 0) { ++held[i].delegates; return 0; }
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return 0;
  struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  if (fcntl(fd, F_SETLK, &lock) != 0) {
    struct flock who = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    int holder = fcntl(fd, F_GETLK, &who) == 0 && who.l_type != F_UNLCK ? (int)who.l_pid : -1;
    close(fd);
    return holder;
  }
  for (int i = 0; i < MAX_HELD; ++i)
    if (held[i].delegates == 0) {
      snprintf(held[i].path, sizeof held[i].path, "%s", path);
      held[i].fd = fd;
      held[i].delegates = 1;
      return 0;
    }
  close(fd);
  return -1;
}

static void release_device(const char* path) {
  for (int i = 0; i < MAX_HELD; ++i)
    if (held[i].delegates > 0 && strcmp(held[i].path, path) == 0) {
      if (--held[i].delegates == 0) close(held[i].fd);
      return;
    }
}

static void log_line(const char* what, char** keys, char** values, size_t n, const char* path_opened) {
  const char* path = getenv("EDGETPU_TEST_DOUBLE_LOG");
  if (path == NULL) return;
  FILE* f = fopen(path, "a");
  if (f == NULL) return;
  fputs(what, f);
  for (size_t i = 0; i < n; ++i) fprintf(f, " %s=%s", keys[i], values[i]);
  if (exclusive()) fprintf(f, " pid=%d path=%s", (int)getpid(), path_opened ? path_opened : "");
  fputc('\n', f);
  fclose(f);
}

void* tflite_plugin_create_delegate(char** options_keys, char** options_values,
                                    size_t num_options, void (*report_error)(const char*)) {
  (void)report_error; /* libedgetpu reports nothing either: it returns NULL */
  const char* device = NULL;
  for (size_t i = 0; i < num_options; ++i)
    if (strcmp(options_keys[i], "device") == 0) device = options_values[i];
  const char* open = getenv("EDGETPU_TEST_DOUBLE_OPEN");
  DoubleDelegate* data = calloc(1, sizeof *data);
  if (select_device(device, data->path, sizeof data->path) < 0 || (open != NULL && strcmp(open, "fail") == 0)) {
    log_line("refused", options_keys, options_values, num_options, NULL);
    free(data);
    return NULL;
  }
  if (exclusive()) {
    const int holder = hold_device(data->path);
    if (holder != 0) {
      const char* log = getenv("EDGETPU_TEST_DOUBLE_LOG");
      FILE* f = log ? fopen(log, "a") : NULL;
      if (f != NULL) {
        fprintf(f, "busy device=%s path=%s holder=%d pid=%d\n", device ? device : "", data->path, holder,
                (int)getpid());
        fclose(f);
      }
      free(data);
      return NULL;
    }
  }
  /* Larger than this file's TfLiteDelegate: fields a newer runtime appends read as zero. */
  TfLiteDelegate* delegate = calloc(1, DELEGATE_BYTES);
  snprintf(data->device, sizeof data->device, "%s", device ? device : "");
  delegate->data_ = data;
  delegate->Prepare = delegate_prepare;
  /* kTfLiteDelegateFlagsAllowDynamicTensors: without it TFLite prepares every node before the
   * delegate's Prepare, and the unresolved edgetpu-custom-op fails there before it can be claimed */
  delegate->flags = 1;
  log_line("created", options_keys, options_values, num_options, data->path);
  return delegate;
}

void tflite_plugin_destroy_delegate(void* delegate) {
  const DoubleDelegate* data = delegate != NULL ? ((TfLiteDelegate*)delegate)->data_ : NULL;
  log_line("destroyed", NULL, NULL, 0, data ? data->path : NULL);
  if (data != NULL && exclusive() && data->path[0] != '\0') release_device(data->path);
  if (delegate != NULL) free(((TfLiteDelegate*)delegate)->data_);
  free(delegate);
}
