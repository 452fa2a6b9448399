module github.com/trainyard/trainyard/tools/paper-draws

go 1.21
