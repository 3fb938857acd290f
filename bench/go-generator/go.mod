module cobalt.example/bench/go-generator

go 1.21
