#ifndef ADTALLY_CZLIB_SHIM_H
#define ADTALLY_CZLIB_SHIM_H
#include <zlib.h>
#endif
