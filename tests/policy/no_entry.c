/* A shared object without kvc_plugin_get: loading it must be refused. */
int kvc_not_a_plugin(void) { return 1; }
