import Foundation

/// The country codes the server accepts (ISO 3166-1 alpha-2 as assigned, XK and ZZ),
/// packed two letters each: a region a device's locale names that is not among them
/// (IC, EA, DG, TA …) is not sent, so the server counts the event as ZZ instead of
/// refusing it. Keep in step with the server's `ISOCodes.countries`.
enum Countries {
    static let codes: Set<String> = {
        let packed = """
            ADAEAFAGAIALAMAOAQARASATAUAWAXAZBABBBDBEBFBGBHBIBJBLBMBNBOBQBRBSBTBVBWBYBZCACCCDCFCGCHCICKCLCMCNCOCR
            CUCVCWCXCYCZDEDJDKDMDODZECEEEGEHERESETFIFJFKFMFOFRGAGBGDGEGFGGGHGIGLGMGNGPGQGRGSGTGUGWGYHKHMHNHRHTHU
            IDIEILIMINIOIQIRISITJEJMJOJPKEKGKHKIKMKNKPKRKWKYKZLALBLCLILKLRLSLTLULVLYMAMCMDMEMFMGMHMKMLMMMNMOMPMQ
            MRMSMTMUMVMWMXMYMZNANCNENFNGNINLNONPNRNUNZOMPAPEPFPGPHPKPLPMPNPRPSPTPWPYQARERORSRURWSASBSCSDSESGSHSI
            SJSKSLSMSNSOSRSSSTSVSXSYSZTCTDTFTGTHTJTKTLTMTNTOTRTTTVTWTZUAUGUMUSUYUZVAVCVEVGVIVNVUWFWSYEYTZAZMZWXK
            ZZ
            """.filter { !$0.isWhitespace }
        var codes = Set<String>()
        var index = packed.startIndex
        while index < packed.endIndex {
            let next = packed.index(index, offsetBy: 2)
            codes.insert(String(packed[index..<next]))
            index = next
        }
        return codes
    }()
}
