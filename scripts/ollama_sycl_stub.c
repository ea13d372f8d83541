/* Stand-in for the libollama-ggml-sycl.so shipped in PyPI's bigdl-core-cpp (IPEX-LLM's Ollama).
 * The real library needs a SYCL GPU and aborts without one ("can not find preferred GPU
 * platform"). This stub registers no SYCL backend (ggml's registry skips a NULL registration),
 * so Ollama runs on its CPU backend. Built by scripts/install_ollama.sh:
 *   gcc -shared -fPIC -O2 -o libollama-ggml-sycl.so ollama_sycl_stub.c
 */
#include <stdbool.h>
#include <stddef.h>

void *ggml_backend_sycl_reg(void) { return NULL; }
void *ggml_backend_sycl_init(int device) { (void)device; return NULL; }
bool ggml_backend_is_sycl(void *backend) { (void)backend; return false; }
void *ggml_backend_sycl_buffer_type(int device) { (void)device; return NULL; }
void *ggml_backend_sycl_host_buffer_type(void) { return NULL; }
void *ggml_backend_sycl_split_buffer_type(const float *tensor_split) { (void)tensor_split; return NULL; }
int ggml_backend_sycl_get_device_count(void) { return 0; }
void ggml_backend_sycl_get_device_description(int device, char *desc, size_t n) {
    (void)device;
    if (n) desc[0] = 0;
}
void ggml_backend_sycl_get_device_name(int device, char *name, size_t n) {
    (void)device;
    if (n) name[0] = 0;
}
void ggml_backend_sycl_get_device_memory(int device, size_t *free_mem, size_t *total_mem) {
    (void)device;
    *free_mem = 0;
    *total_mem = 0;
}
void ggml_backend_sycl_get_gpu_list(int *list, int n) {
    for (int i = 0; i < n; i++) list[i] = -1;
}
void ggml_backend_sycl_print_sycl_devices(void) {}
