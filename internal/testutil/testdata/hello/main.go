// Command hello is a tiny main package for TestBuildBinary.
package main

import "fmt"

func main() { fmt.Println("hello") }
