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
 *   EDGETPU_TEST_DOUBLE_VERSION  what edgetpu_version() returns.
 *   EDGETPU_TEST_DOUBLE_OPEN     "fail": every delegate creation fails (as when the
 *                                device exists but cannot be opened).
 *   EDGETPU_TEST_DOUBLE_LOG      file that gets one line per delegate created/destroyed,
 *                                with the options received, for tests to assert on.
 *
 * Its delegate claims no node: the model runs on the runtime's CPU kernels, so tests through
 * it check routing, options and device bookkeeping, never the TPU's arithmetic (its outputs
 * equal the CPU's by construction). Device
 * selection follows libedgetpu's rules for the "device" option ("", ":N", "usb",
 * "usb:N", "pci", "pci:N"): a spec that names no listed device gives no delegate.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Parses EDGETPU_TEST_DOUBLE_DEVICES; the caller frees with edgetpu_free_devices. */
struct edgetpu_device* edgetpu_list_devices(size_t* num_devices) {
  *num_devices = 0;
  const char* spec = getenv("EDGETPU_TEST_DOUBLE_DEVICES");
  if (spec == NULL || *spec == '\0') return NULL;

  size_t capacity = 1;
  for (const char* c = spec; *c; ++c) capacity += (*c == ',');
  struct edgetpu_device* devices = calloc(capacity + 1, sizeof *devices);
  char* copy = strdup(spec);
  char* save = NULL;
  for (char* item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
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

static int kTfLiteOk = 0;

static int prepare_claims_nothing(void* context, void* delegate) {
  (void)context;
  (void)delegate;
  return kTfLiteOk;
}

/* Index of the listed device a "device" option names, or -1 (libedgetpu's rules). */
static int select_device(const char* option) {
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
  edgetpu_free_devices(devices);
  return chosen;
}

static void log_line(const char* what, char** keys, char** values, size_t n) {
  const char* path = getenv("EDGETPU_TEST_DOUBLE_LOG");
  if (path == NULL) return;
  FILE* f = fopen(path, "a");
  if (f == NULL) return;
  fputs(what, f);
  for (size_t i = 0; i < n; ++i) fprintf(f, " %s=%s", keys[i], values[i]);
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
  if (select_device(device) < 0 || (open != NULL && strcmp(open, "fail") == 0)) {
    log_line("refused", options_keys, options_values, num_options);
    return NULL;
  }
  void** delegate = calloc(1, DELEGATE_BYTES);
  /* TfLiteDelegate: data_, then Prepare; flags and the rest stay zero. */
  delegate[1] = (void*)prepare_claims_nothing;
  log_line("created", options_keys, options_values, num_options);
  return delegate;
}

void tflite_plugin_destroy_delegate(void* delegate) {
  log_line("destroyed", NULL, NULL, 0);
  free(delegate);
}
