// The packager of the Go client, a module of its own so that it is not part
// of the client's module zip. Standard library only.
module fenced_lock/clients/go/tools/modzip

go 1.19
