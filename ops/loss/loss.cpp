#include "ops/loss/loss.h"
namespace opforge { void register_loss(Registry&) {} }
