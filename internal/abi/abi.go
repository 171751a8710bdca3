// Package abi is the one Go home of backstop.wasm's ABI (wasm/ABI.md): its
// version, error codes, limits, flags, the decide_batch record and the
// packed words, generated from contract/abi.json into abi_gen.go (`make
// contract`), as every other language's bindings are. The module (wasm/)
// and the Go host (host/) both use it, so they cannot drift apart.
package abi

// PackBudget encodes BudgetTokens' answer (Policy.BudgetTokens) in one
// result word, clamping the amount to 0..BudgetMilliMask; a policy without
// a budget answers 0.
func PackBudget(milli int64, ok bool) int64 {
	if !ok {
		return 0
	}
	return min(max(milli, 0), BudgetMilliMask) | 1<<BudgetPresentShift
}

// UnpackBudget decodes a word made by PackBudget.
func UnpackBudget(w int64) (milli int64, ok bool) {
	return w >> BudgetMilliShift & BudgetMilliMask, w>>BudgetPresentShift&1 != 0
}
