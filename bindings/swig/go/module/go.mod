module libkvcache.org/kvcache

go 1.19
