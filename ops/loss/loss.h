#pragma once
#include "opforge/registry.h"
namespace opforge { void register_loss(Registry& reg); }
